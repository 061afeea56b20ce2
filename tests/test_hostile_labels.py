"""Labels from anyone (issue 22): a label of a trace, a process name or a --label holding every
bidirectional control character and running to hundreds of characters is shown, in every
renderer, with each control escaped visibly and cut to LABEL_MAX characters (the full label stays
in --json and the trace): terminal text, Markdown, the HTML dashboard and the SVG text plotly.js
draws from it in Chromium, the Perfetto and Chrome exports, and serve's Prometheus labels.

A bidi control (U+202E RIGHT-TO-LEFT OVERRIDE and its kin) reorders how the text after it is
drawn: `pool-off\u202eno-loop` reads as "pool-offpool-on" in a browser or a viewer."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from ckptrace.core.terminal import LABEL_MAX
from helpers import CKPTRACE, ckptrace

SAMPLES = Path(__file__).resolve().parents[1] / "samples" / "traces"
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
# A label past LABEL_MAX with every bidi control at its start: its cut keeps them all.
BASE_LABEL = "off" + BIDI + "x" * 300
CAND_LABEL = "on" + BIDI + "y" * 300
# A JSON escape that a browser decodes to a bidi control (one backslash before the u, not two).
JSON_BIDI = re.compile(r"(?<!\\)(?:\\\\)*\\u(?:202[a-eA-E]|206[6-9]|200[eEfF]|061[cC])")


def assert_shown_safely(text: str, where: str, json_text: bool = False) -> None:
    """No bidi control (nor, in JSON, an escape decoding to one), and no run of a label's filler
    longer than LABEL_MAX: cut where shown."""
    assert not any(c in text for c in BIDI), (where, [hex(ord(c)) for c in BIDI if c in text])
    assert not (json_text and JSON_BIDI.search(text)), (where, json_text and JSON_BIDI.search(text).group(0))
    assert "x" * LABEL_MAX not in text and "y" * LABEL_MAX not in text, where


def figure_data(html: str) -> str:
    """The page's figure data: each Plotly.newPlot call to the end of its script (plotly.js
    itself, embedded before them, holds bidi characters of its own in its text handling)."""
    calls = [m.start() for m in re.finditer(r"Plotly\.newPlot\(", html)]
    assert calls
    return "\n".join(html[s:html.index("</script>", s)] for s in calls)


@pytest.fixture(scope="module")
def legs(tmp_path_factory):
    from ckptrace.core.trace import read_trace, write_trace

    d = tmp_path_factory.mktemp("labels")
    out = []
    for src, label in (("1-pool-off", BASE_LABEL), ("2-pool-on", CAND_LABEL), ("3-pool-off", BASE_LABEL)):
        t = read_trace(SAMPLES / f"{src}.parquet")
        dst = d / f"{src}.parquet"
        write_trace(dst, t.events, dataclasses.replace(t.meta, label=label, command=["cmd" + BIDI, "--flag"]))
        out.append(dst)
    return out


@pytest.mark.parametrize("args", [["analyze"], ["analyze", "--all"], ["compare"], ["compare", "--format", "markdown"]],
                         ids=["analyze", "analyze-all", "compare", "compare-markdown"])
def test_terminal_and_markdown_show_labels_escaped_and_cut(legs, args):
    r = ckptrace(*args, *(legs[:1] if args[0] == "analyze" else legs))
    assert r.returncode == 0, r.stderr
    assert_shown_safely(r.stdout + r.stderr, " ".join(args))
    assert "\\u202e" in r.stdout  # shown, as an escape


def test_json_keeps_the_whole_label(legs):
    doc = json.loads(ckptrace("analyze", "--json", legs[0]).stdout)
    assert doc["trace"]["label"] == BASE_LABEL


def test_the_dashboard_file_holds_no_bidi_control_and_cut_labels(legs, tmp_path):
    out = tmp_path / "r.html"
    r = ckptrace("dashboard", *legs, "-o", out, "--title", "t" + BIDI + "t")
    assert r.returncode == 0, r.stderr
    assert_shown_safely(figure_data(out.read_text()), "dashboard", json_text=True)


@pytest.mark.parametrize("fmt", ["perfetto", "chrome"])
def test_exports_hold_no_bidi_control_and_cut_track_names(legs, tmp_path, fmt):
    out = tmp_path / ("t.json" if fmt == "chrome" else "t.perfetto-trace")
    r = ckptrace("export", *legs, "-o", out, *(["--format", "perfetto"] if fmt == "perfetto" else []))
    assert r.returncode == 0, r.stderr
    if fmt == "chrome":
        strings, names = [], []

        def walk(x, key=None):
            if isinstance(x, str):
                strings.append(x)
                if key == "name":
                    names.append(x)
            elif isinstance(x, dict):
                for k, v in x.items():
                    walk(k), walk(v, k)
            elif isinstance(x, list):
                for v in x:
                    walk(v)
        walk(json.loads(out.read_text()))
        assert_shown_safely("\n".join(strings).replace("x" * 300, "").replace("y" * 300, ""), "chrome")
        assert_shown_safely("\n".join(names), "chrome names")
    else:  # every string of the decoded protobuf (raw bytes: a 2-byte control like U+061C turns up by chance)
        strings = perfetto_strings(out.read_bytes())
        assert not any(c in x for x in strings for c in BIDI)
        assert not any("x" * LABEL_MAX in x.replace("x" * 300, "") for x in strings)  # the full label only as an argument


def perfetto_strings(data: bytes) -> list[str]:
    """Every string field anywhere in a Perfetto trace, decoded by its own proto."""
    from google.protobuf.descriptor import FieldDescriptor
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(data)
    out: list[str] = []

    def walk(msg):
        for field, value in msg.ListFields():
            values = value if field.is_repeated else [value]
            for v in values:
                if field.type == FieldDescriptor.TYPE_MESSAGE:
                    walk(v)
                elif field.type == FieldDescriptor.TYPE_STRING:
                    out.append(v)
    walk(trace)
    assert out, "no string in the trace"
    return out


# --- in a real browser: the SVG text plotly.js draws ----------------------------------------

@pytest.mark.browser
def test_the_svg_text_plotly_draws_holds_no_bidi_control(legs, tmp_path):
    from browser import Browser, chromium_available

    if not chromium_available():
        pytest.skip("chromium not installed (apt-get install chromium)")
    out = tmp_path / "r.html"
    assert ckptrace("dashboard", *legs, "-o", out).returncode == 0
    with Browser.start(width=1400, height=1600) as b:
        b.open(out)
        assert b.wait_until("[...document.querySelectorAll('.plotly-graph-div')]"
                            ".every(d => d._fullLayout && d.querySelector('.main-svg'))", timeout_s=60)
        texts = b.evaluate("[...document.querySelectorAll('svg text')].map(t => t.textContent)")
        assert b.errors() == []
    joined = "\n".join(texts)
    assert_shown_safely(joined, "svg text")
    assert any("\\u202e" in t for t in texts)  # the labels are there, escaped


# --- a process name from a hostile user -------------------------------------------------------

@pytest.mark.ebpf
def test_a_process_named_with_a_bidi_control_is_shown_escaped(require_root_ebpf, workload, nobody_dir, tmp_path):
    """User nobody runs two sample workloads, one whose executable (so its comm, 15 bytes) holds
    U+202E. Recorded and served by root, its name and default label (NAME#RANK) reach analyze's
    per-process table, the dashboard, both exports and serve's label escaped."""
    import shutil
    import subprocess
    import urllib.request

    from helpers import AS_NOBODY, go, recorder, started

    names = ["w\u202eload", "plain"]
    for n in names:
        d = nobody_dir / n
        d.mkdir()
        for f in ("ckpt-workload", "libsample-server.so", "libsample-common.so", "libsample-llama.so"):
            shutil.copy2(Path(workload).with_name(f), d / f)
        (d / "ckpt-workload").rename(d / n)
    subprocess.run(["chown", "-R", "65534:65534", nobody_dir], check=True)
    out = tmp_path / "t.parquet"
    with started([*AS_NOBODY, nobody_dir / names[0] / names[0], "--wait-signal", "--iterations", "3"],
                 ready="ready pid=", cwd="/") as (a, _), \
            started([*AS_NOBODY, nobody_dir / names[1] / names[1], "--wait-signal", "--iterations", "3"],
                    ready="ready pid=", cwd="/") as (b, _):
        assert Path(f"/proc/{a.pid}/comm").read_text().strip() == names[0]
        with started([CKPTRACE, "serve", "--listen", "127.0.0.1:0", "--pid", a.pid, "--pid", b.pid],
                     ready="ckptrace: serving http://127.0.0.1:") as (srv, line):
            assert_shown_safely(line, "serve's ready line")
            url = re.search(r"(http://\S+/metrics)", line).group(1)
            with urllib.request.urlopen(url, timeout=10) as r:
                metrics = r.read().decode()
            assert f'label="w\\\\u202eload"' in metrics  # the text \u202e, in Prometheus' own escaping
            assert_shown_safely(metrics, "/metrics")
            with recorder(out, "--pid", a.pid, "--pid", b.pid) as rec:
                go(a), go(b)
                assert a.wait(120) == 0 and b.wait(120) == 0
                assert rec.wait(120) == 0
            srv.terminate()
            srv.wait(120)
    r = ckptrace("analyze", out)
    assert r.returncode == 0 and "w\\u202eload#1" in r.stdout, r.stdout
    assert_shown_safely(r.stdout + r.stderr, "analyze")
    html, pf = tmp_path / "r.html", tmp_path / "t.perfetto-trace"
    assert ckptrace("dashboard", out, "-o", html).returncode == 0
    assert_shown_safely(figure_data(html.read_text()), "dashboard", json_text=True)
    assert ckptrace("export", out, "-o", pf).returncode == 0
    assert "\u202e".encode() not in pf.read_bytes() and b"w\\u202eload" in pf.read_bytes()
