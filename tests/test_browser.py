"""tests/browser.py can fail: each kind of breakage it exists to catch, put on a small page, is reported."""

from __future__ import annotations

import base64
import struct
import sys
import zlib
from pathlib import Path

import pytest
from browser import PageCheck, find_chromium, open_page, open_pages, require_browser


def tiny_png(width: int = 3, height: int = 2) -> bytes:
    """A valid RGB PNG of the given size, all red."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def page(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>{name}</title></head>"
                    f"<body>{body}</body></html>", encoding="utf-8")
    return path


GOOD_IMG = f'<img alt="red" src="data:image/png;base64,{base64.b64encode(tiny_png()).decode()}">'


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_browser()


def test_good_page_is_clean(tmp_path: Path, chromium: str) -> None:
    check = open_page(page(tmp_path, "good.html", f"<p>hello</p>{GOOD_IMG}"), chromium)
    assert check.problems() == []
    assert [(w, h) for _, w, h in check.images] == [(3, 2)]
    assert check.images[0][0].startswith("data:image/png;base64,iVBOR") and len(check.images[0][0]) <= 80


def test_console_error_is_reported(tmp_path: Path, chromium: str) -> None:
    check = open_page(page(tmp_path, "console.html", '<script>console.error("boom")</script>'), chromium)
    assert check.console_errors == ["boom"]


def test_uncaught_exception_is_reported(tmp_path: Path, chromium: str) -> None:
    check = open_page(page(tmp_path, "throw.html", '<script>throw new Error("x")</script>'), chromium)
    assert check.console_errors == ["uncaught Error: x"]


def test_broken_images_are_reported(tmp_path: Path, chromium: str) -> None:
    body = f'{GOOD_IMG}<img src="data:image/png;base64,AAAA"><img src="missing.png"><img loading="lazy" ' \
           f'style="margin-top:5000px" src="also-missing.png">'
    check = open_page(page(tmp_path, "broken.html", body), chromium)
    # in document order; long file: URLs (the tmp_path's) are cut to 80 characters, keeping the file name
    assert [(w, h) for _, w, h in check.images] == [(3, 2), (0, 0), (0, 0), (0, 0)]
    assert check.images[1][0] == "data:image/png;base64,AAAA"
    assert [src.rsplit("/", 1)[-1] for src, _, _ in check.images[2:]] == ["missing.png", "also-missing.png"]
    assert all(len(src) <= 80 for src, _, _ in check.images[2:])
    # the undecodable data: URI is no request; the two missing files are, and fail
    assert len(check.failed_requests) == 2 and all("ERR_FILE_NOT_FOUND" in r for r in check.failed_requests)
    assert len(check.problems()) == 3 + 2 + 2  # 3 images of size 0, 2 failed requests, 2 "Failed to load resource"


def test_missing_stylesheet_is_a_failed_request(tmp_path: Path, chromium: str) -> None:
    check = open_page(page(tmp_path, "css.html", '<link rel="stylesheet" href="nowhere.css"><p>x</p>'), chromium)
    assert len(check.failed_requests) == 1 and "nowhere.css" in check.failed_requests[0]


def test_one_browser_checks_several_pages(tmp_path: Path, chromium: str) -> None:
    good = page(tmp_path, "a.html", GOOD_IMG)
    bad = page(tmp_path, "b.html", '<script>throw new TypeError("y")</script>')
    checks = open_pages([good, bad], chromium)
    assert checks[good].problems() == [] and checks[bad].console_errors == ["uncaught TypeError: y"]
    assert isinstance(checks[good], PageCheck)


def test_missing_file_is_an_error_not_a_page(tmp_path: Path, chromium: str) -> None:
    with pytest.raises(FileNotFoundError):
        open_page(tmp_path / "nope.html", chromium)


def test_find_chromium_honours_env_var(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SERVING_LAB_CHROMIUM", str(tmp_path / "no-such-browser"))
    assert find_chromium() is None
    with pytest.raises(pytest.skip.Exception, match="no headless Chromium.*apt-get install chromium"):
        require_browser()


def test_require_browser_skips_without_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    if find_chromium() is None:
        pytest.skip("no Chromium here: the Playwright branch is not reached")
    monkeypatch.setitem(sys.modules, "playwright.sync_api", None)  # makes the import fail
    with pytest.raises(pytest.skip.Exception, match="Playwright is not installed"):
        require_browser()
