"""What the results page reads out of ``front.json``: the front as shown, its baselines, the
recommended point, latency in words, and the data of the interactive chart.

Consumes ``front.json`` as a plain dict (read with ``.get`` defaults, so files written before a
field existed still show); produces plain values for :mod:`mpsearch.serve._results` and the
page's script. A point is *shown* (part of "the front") unless ``front.json`` says otherwise:
its ``shown`` flag, or, in files without one, ``dominated: true`` hides it. The recommended
point is ``front.json``'s ``recommended`` (an index into ``points``); when a file has none, the
page suggests, among the shown points with the best held-out metric, the smallest one (ties:
the fastest at batch 1, then the lowest index) and says that the page chose it. A point the
target's verification rejected (``target_failure``) is marked and never recommended; when it
rejected every shown point, :func:`unverified` says so (the CLI's exit 4).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mpsearch.rundir import latency_words

__all__ = ["Latency", "baselines", "chart_data", "export_index", "failure", "is_shown",
           "latency", "recommendation", "recommended_index", "unverified", "words"]

Latency = tuple[float | None, tuple[float, float] | None]
"""A latency in ms and its spread ([low, high] ms), each None when unknown."""

#: baseline key in ``front.json`` -> the label the page gives it
_LABELS = {"fp32": "FP32", "int8": "uniform INT8", "int16": "uniform INT16",
           "fp16": "uniform FP16", "fp16w": "uniform FP16 weights",
           "a16w16": "uniform A16W16", "a16w8": "uniform A16W8"}


def is_shown(point: Mapping[str, Any]) -> bool:
    """True when ``point`` belongs to the front as shown (see the module doc)."""
    shown = point.get("shown")
    if shown is None:
        return not bool(point.get("dominated", False))
    return bool(shown)


def failure(point: Mapping[str, Any]) -> str | None:
    """Why the target's verification rejected ``point`` (None: it passed, or was not
    verified)."""
    text = point.get("target_failure")
    return str(text) if text else None


def unverified(front: Mapping[str, Any]) -> str | None:
    """"no verified point: ..." with each shown point's reason when the target's verification
    rejected every shown point (the CLI then exits 4); None when one passed or none was
    verified."""
    shown = [p for p in _points(front) if is_shown(p)]
    if not shown or any(not p.get("target_placement") or failure(p) is None for p in shown):
        return None
    tool = (shown[0].get("target_placement") or {}).get("toolchain") or "the target"
    reasons = "; ".join(f"point {p.get('index')}: {failure(p)}" for p in shown)
    return (f"no verified point: all {len(shown)} shown point(s) failed verification on "
            f"{tool} ({reasons})")


def _points(front: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [p for p in front.get("points") or () if isinstance(p, Mapping)]


def _better(front: Mapping[str, Any], a: float, b: float) -> bool:
    return a > b if front.get("higher_is_better", True) else a < b


def recommended_index(front: Mapping[str, Any]) -> tuple[int | None, bool]:
    """(the ``index`` of the point to preselect, whether ``front.json`` chose it).

    ``recommended`` may be null (nothing to recommend: then nothing is preselected); when the
    key is absent the page's own rule applies (module doc). A point the target rejected is
    never the one."""
    points = _points(front)
    if "recommended" in front:
        k = front.get("recommended")
        if isinstance(k, int) and 0 <= k < len(points) and failure(points[k]) is None:
            return int(points[k].get("index", k)), True
        return None, True
    shown = [p for p in points if is_shown(p) and failure(p) is None]
    if not shown:
        return None, False
    best = shown[0]["metric"]
    for p in shown[1:]:
        if _better(front, float(p["metric"]), float(best)):
            best = p["metric"]
    top = [p for p in shown if float(p["metric"]) == float(best)]
    chosen = min(top, key=lambda p: (int(p["size"]), _ms(p) if _ms(p) is not None else 1e300,
                                     int(p.get("index", 0))))
    return int(chosen.get("index", 0)), False


def export_index(front: Mapping[str, Any] | None) -> int | None:
    """The point the page's export command names first: the recommended one, else the first
    shown, else the first point (None without points)."""
    if front is None:
        return None
    k, _ = recommended_index(front)
    if k is not None:
        return k
    points = _points(front)
    first = next((p for p in points if is_shown(p)), points[0] if points else None)
    return None if first is None else int(first.get("index", 0))


def _ms(entry: Mapping[str, Any], key: str = "latency_ms") -> float | None:
    value = entry.get(key)
    return float(value) if isinstance(value, (int, float)) else None


def latency(entry: Mapping[str, Any], batch: bool = False) -> Latency:
    """(ms, [low, high] ms) at batch 1, or at the timing batch when ``batch``."""
    key = "batch_latency_ms" if batch else "latency_ms"
    spread = entry.get(f"{key}_interval")
    interval = None
    if isinstance(spread, Sequence) and len(spread) == 2 and all(
            isinstance(v, (int, float)) for v in spread):
        interval = (float(spread[0]), float(spread[1]))
    return _ms(entry, key), interval


def words(entry: Mapping[str, Any], front: Mapping[str, Any]) -> str | None:
    """``entry``'s latency against FP32 at batch 1 and the timing batch, in the words the CLI
    and the report print for it (:func:`mpsearch.rundir.latency_words`); None when unknown."""
    text = latency_words(entry, front.get("fp32") or {}, batch=front.get("latency_batch"),
                         source=front.get("latency_source"))
    return None if text == "unknown" else text


def baselines(front: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(key, label, entry) of FP32 and each uniform format, FP32 first."""
    out: list[tuple[str, str, Mapping[str, Any]]] = []
    fp32 = front.get("fp32")
    if isinstance(fp32, Mapping) and "metric" in fp32:
        out.append(("fp32", "FP32", fp32))
    for key, entry in sorted((front.get("uniform") or {}).items()):
        if isinstance(entry, Mapping) and "metric" in entry:
            out.append((str(key), _LABELS.get(str(key), f"uniform {str(key).upper()}"), entry))
    return out


def _kb(size: float) -> str:
    return f"{size / 1000:.1f} kB" if size < 1e6 else f"{size / 1e6:.2f} MB"


def _ms_text(value: float) -> str:
    return f"{value:.3g} ms"


def recommendation(front: Mapping[str, Any]) -> str | None:
    """The line above the table: ``front.json``'s ``recommendation``, else one the page
    builds for the point of :func:`recommended_index`, saying the page chose it."""
    text = front.get("recommendation")
    if isinstance(text, str) and text.strip():
        return text.strip()
    k, from_file = recommended_index(front)
    if k is None:
        return unverified(front) or (None if from_file else "No point met the constraints.")
    point = next(p for p in _points(front) if int(p.get("index", -1)) == k)
    fp32 = front.get("fp32") or {}
    parts = [f"point {k}: {_kb(float(point['size']))}"]
    if fp32.get("size"):
        parts[0] += f" ({float(fp32['size']) / float(point['size']):.2f}× smaller than FP32)"
    ms, _ = latency(point)
    said = words(point, front)
    if ms is not None or said:
        parts.append(", ".join(x for x in ((_ms_text(ms) if ms is not None else None),
                                            said) if x))
    metric = f"{front.get('metric', 'metric')} {float(point['metric']):.4f}"
    if "metric" in fp32:
        metric += f" ({float(point['metric']) - float(fp32['metric']):+.4f} against FP32)"
    parts.append(metric)
    return ("Suggested by this page (the search wrote no recommendation; rule: the smallest "
            "shown point with the best held-out metric): " + "; ".join(parts))


def _hover(label: str, entry: Mapping[str, Any], metric: str, front: Mapping[str, Any]
           ) -> str:
    lines = [label, f"{metric} {float(entry['metric']):.4f} (held-out)",
             f"weights {_kb(float(entry['size']))}"]
    for batch, name in ((False, "batch 1"), (True, "batch N")):
        ms, spread = latency(entry, batch)
        if ms is not None:
            text = f"{name}: {_ms_text(ms)}"
            if spread is not None:
                text += f" [{spread[0]:.3g}–{spread[1]:.3g}]"
            said = None if batch or entry is front.get("fp32") else words(entry, front)
            lines.append(text + (f", {said}" if said else ""))
    return "<br>".join(lines)


def _also_here(points: list[dict[str, Any]], marks: list[dict[str, Any]]) -> None:
    """Add to each hover text the other points and baselines drawn at the same place: the
    pointer reaches only the top marker of a stack, so its text names the ones under it."""
    spots: dict[tuple[float, int], list[str]] = {}
    for entry in points:
        spots.setdefault((entry["metric"], entry["size"]), []).append(
            f"point {entry['index']}" + ("" if entry["shown"] else " (hidden)"))
    for entry in marks:
        spots.setdefault((entry["metric"], entry["size"]), []).append(entry["label"])
    for entry in [*points, *marks]:
        own = f"point {entry['index']}" if "label" not in entry else entry["label"]
        others = [n for n in spots[(entry["metric"], entry["size"])]
                  if n != own and not n.startswith(own + " ")]
        if others:
            entry["hover"] += "<br>also here: " + ", ".join(others)


def chart_data(front: Mapping[str, Any] | None, partial: Mapping[str, Any] | None
               ) -> dict[str, Any] | None:
    """What the page's script draws in ``#results-chart`` with plotly.js: the shown points
    (latency at batch 1 as colour, when measured), the baselines and the hidden points, with
    hover text; ``index`` ties a chart point to its table row."""
    if front is not None and _points(front):
        metric = str(front.get("metric", "metric"))
        batch = front.get("latency_batch")
        batch_name = f"batch {batch}" if batch else "batch N"
        bases = baselines(front)
        same = {(float(b["metric"]), int(b["size"])): label for _, label, b in bases}
        shown_at = {(float(p["metric"]), int(p["size"])): int(p.get("index", 0))
                    for p in _points(front) if is_shown(p)}
        points = []
        for p in _points(front):
            k = int(p.get("index", 0))
            by = p.get("beaten_by") or "another point"
            twin = same.get((float(p["metric"]), int(p["size"])))
            label = (f"point {k}" + (f" = {twin}" if twin else "")
                     + ("" if is_shown(p) else f" (hidden: beaten by {by})")
                     + ("" if failure(p) is None else " (failed on the target)"))
            points.append({"index": k, "metric": float(p["metric"]), "size": int(p["size"]),
                           "ms": latency(p)[0], "shown": is_shown(p),
                           "hover": _hover(label, p, metric, front).replace("batch N",
                                                                           batch_name)})
        marks = []
        for _, label, b in bases:  # a baseline on a shown point names it and selects it
            twin_of = shown_at.get((float(b["metric"]), int(b["size"])))
            name = label + ("" if twin_of is None else f" = point {twin_of}")
            marks.append({"label": label, "metric": float(b["metric"]), "size": int(b["size"]),
                          "ms": latency(b)[0], "index": twin_of,
                          "hover": _hover(name, b, metric, front).replace("batch N",
                                                                         batch_name)})
        _also_here(points, marks)
        selected, _ = recommended_index(front)
        return {"kind": "front", "points": points, "marks": marks, "selected": selected,
                "y": f"{metric} (held-out split)", "x": "weights (bytes)",
                "colour": "latency at batch 1 (ms)"}
    if partial is not None and partial.get("front"):
        return {"kind": "partial", "all": partial.get("points") or [],
                "front": partial["front"], "y": "metric (search split)",
                "x": "weights (bytes)"}
    return None
