"""`serving-lab generate` as a new user meets it: a `--max-tokens` beyond the model's context is refused before
anything runs, the tokens show as a progress bar, and Ctrl-C ends it with one line and exit status 130."""

from __future__ import annotations

import pytest

from serving_lab import cli


@pytest.fixture(scope="module")
def tiny(make_tiny_hf_model):
    return make_tiny_hf_model("llama", name="generate-cli-llama")  # a context of 256 tokens


def test_max_tokens_beyond_the_context_is_refused(tiny, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "hello", "--model", str(tiny), "--max-tokens", "1000000", "--no-chat"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--max-tokens 1000000: the model's context is 256 tokens" in err and "Traceback" not in err


def test_generate_prints_the_text_and_shows_progress(tiny, capsys):
    cli.main(["generate", "hello", "--model", str(tiny), "--max-tokens", "6", "--no-chat"])
    captured = capsys.readouterr()
    assert captured.out.startswith("### hello\n")
    assert "generate" in captured.err and "tok" in captured.err  # tqdm's bar, counted in tokens


def test_ctrl_c_exits_130_without_a_traceback(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_generate", interrupted)
    with pytest.raises(SystemExit) as exit_:
        cli.main(["generate", "hello"])
    assert exit_.value.code == 130
    assert capsys.readouterr().err.strip() == "serving-lab: interrupted"
