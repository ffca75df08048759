"""Sizes and latencies in words: the one wording the CLI, the report and the web page print.

Consumes a front entry (a :class:`~mpsearch.rundir.FrontPoint` or :class:`~mpsearch.rundir.
Baseline`, or its ``front.json`` dict) and FP32's; produces text. A point's latency against
FP32 reads the same wherever it is shown because every place calls :func:`latency_words`:

- timed, at each batch it was timed at (batch 1 and the timing batch): "1.18x slower than FP32
  [1.05-1.32] at batch 1, 1.40x slower [1.30-1.52] at batch 8", the bracket being the ratio's
  range over the runs' spreads (the slowest run against FP32's fastest and the reverse);
- "as fast as FP32 (within the spread)" at a batch where the two spreads overlap: the
  difference is not measurable there, whatever the medians say;
- estimated (the profile's cost model): "1.65x faster than FP32 (the profile's estimate)";
- "not timed (hidden)" for a point hidden on held-out metric and size in a timed front, whose
  timing would change no answer;
- "unknown" otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["estimate_text", "format_bytes", "formats_text", "latency_words", "measurably_slower",
           "speed_at", "versus_fp32"]

Spread = tuple[float, float]

#: The words where the spreads overlap.
_SAME = "as fast as FP32 (within the spread)"

#: What :func:`latency_words` says when nothing is known.
UNKNOWN = "unknown"
#: What it says of a hidden point that a timed front did not time.
NOT_TIMED = "not timed (hidden)"


def format_bytes(size: float) -> str:
    """Bytes for people, decimal units: 812 B, 81.1 kB, 3.91 MB, 215 MB."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}" if size < 100 * scale else \
                f"{size / scale:.0f} {unit}"
    return f"{size:.0f} B"


def estimate_text(estimate: Sequence[float], digits: int) -> str:
    """An estimate and its 95 % interval, ``[mean, low, high]``, as every table prints it:
    "18.19 [14.76, 22.41]"."""
    mean, low, high = estimate
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def formats_text(counts: Mapping[str, int]) -> str:
    """Node counts by format, as every table prints them: "a16w16 2, int16 17, int8 2"."""
    return ", ".join(f"{fmt} {n}" for fmt, n in sorted(counts.items()))


def versus_fp32(relative: float | None) -> str:
    """A latency relative to FP32's in words: "2.69x slower than FP32", "1.65x faster than
    FP32", "as fast as FP32" (within 0.5 %); "-" when unknown."""
    if relative is None or not relative > 0:
        return "-"
    if abs(relative - 1.0) < 0.005:
        return "as fast as FP32"
    if relative < 1.0:
        return f"{1.0 / relative:.2f}x faster than FP32"
    return f"{relative:.2f}x slower than FP32"


def measurably_slower(mine: Spread | None, theirs: Spread | None) -> bool:
    """Whether the spread ``mine`` lies wholly above ``theirs`` (its fastest run slower than
    their slowest); False when either is unknown."""
    return (mine is not None and theirs is not None and mine[0] == mine[0]
            and theirs[1] == theirs[1] and mine[0] > theirs[1])


def _spread(value: Any) -> Spread | None:
    if value is None or len(value) != 2 or any(not isinstance(v, (int, float)) for v in value):
        return None
    low, high = float(value[0]), float(value[1])
    return None if low != low or high != high or low <= 0 else (low, high)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def speed_at(ms: float | None, spread: Any, fp32_ms: float | None, fp32_spread: Any
             ) -> str | None:
    """One batch's median ``ms`` (spread ``[fastest, slowest]`` ms) against FP32's, in words
    (module doc); None when either median is unknown."""
    ms, fp32_ms = _number(ms), _number(fp32_ms)
    if ms is None or fp32_ms is None:
        return None
    mine, theirs = _spread(spread), _spread(fp32_spread)
    if mine is None or theirs is None:
        return versus_fp32(ms / fp32_ms)
    if not (measurably_slower(mine, theirs) or measurably_slower(theirs, mine)):
        return _SAME
    if ms > fp32_ms:
        return (f"{ms / fp32_ms:.2f}x slower than FP32 "
                f"[{mine[0] / theirs[1]:.2f}-{mine[1] / theirs[0]:.2f}]")
    return (f"{fp32_ms / ms:.2f}x faster than FP32 "
            f"[{theirs[0] / mine[1]:.2f}-{theirs[1] / mine[0]:.2f}]")


def _get(entry: Any, name: str) -> Any:
    return entry.get(name) if isinstance(entry, Mapping) else getattr(entry, name, None)


def latency_words(entry: Any, fp32: Any, *, batch: int | None, source: str | None) -> str:
    """``entry``'s latency against ``fp32``'s (each a front point, a baseline or its
    ``front.json`` dict) at batch 1 and at the timing ``batch``, in words (module doc);
    ``source`` is the front's ``latency_source``."""
    parts = []
    batches = [(1, "latency_ms")]
    if batch is not None and batch != 1:
        batches.append((batch, "batch_latency_ms"))
    for size, key in batches:
        words = speed_at(_get(entry, key), _get(entry, f"{key}_interval"), _get(fp32, key),
                         _get(fp32, f"{key}_interval"))
        if words is not None:
            parts.append((size, words))
    if not parts:
        relative = _get(entry, "latency")
        if relative is None or not relative > 0:
            hidden = source == "measured" and _get(entry, "shown") is False
            return NOT_TIMED if hidden else UNKNOWN
        how = " (the profile's estimate)" if source == "estimated" else ""
        return versus_fp32(relative) + how
    if len(parts) == 2 and parts[0][1] == parts[1][1] == _SAME:
        return f"{parts[0][1]} at batch {parts[0][0]} and at batch {parts[1][0]}"
    said = False
    out = []
    for size, words in parts:
        if said:
            words = words.replace(" than FP32", "", 1)
        said = said or " than FP32" in words
        out.append(f"{words} at batch {size}")
    return ", ".join(out)
