"""Reference solutions of the exercises (same names and signatures as the stubs in lessons/exercises/).

Try the exercise first. Solutions that the engine already implements are thin wrappers around the engine's
own code, so the tests check your answer against the real scheduler, block pool and model dimensions.
"""
