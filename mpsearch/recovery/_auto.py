"""Recovery ``auto``: which of CLE, SmoothQuant, GPTQ and bias correction a model gets, decided
by measuring them on the search split.

Contract
--------
Consumes the loaded graph, the profile, the calibration split (for every statistic and table,
as the explicit settings use it), the search split (for every score; never held-out data), a
function that calibrates a graph, and the settings asked (``True``/``False`` fixed, ``None``
decided). Produces a :class:`Recovered`: the graph, calibration table, input means and
Hessians the run then uses, and a :class:`RecoveryDecision` saying what was tried, what it
bought and why each method is on or off.

A method is tried only where it applies: CLE where Conv -> (Relu | Clip | nothing) -> Conv
pairs can be equalized (:func:`~mpsearch.recovery.equalization_pairs`), SmoothQuant where a
LayerNorm feeding MatMul/Gemm weights has outlier channels (largest channel maximum at least
:data:`OUTLIER_RATIO` times the median one, from one FP32 pass over the calibration split),
GPTQ and bias correction where a Conv/Gemm/MatMul has a weight. A candidate is scored by the
model-output SQNR against FP32 of the uniform builds at the profile's narrowest and widest
activation format with 8-bit integer weights (``int8`` and A16W8 ``int16`` on x86), on the
first :data:`DECISION_SAMPLES` samples of the search split; the score is the mean of those
SQNRs in dB. The graph transforms are decided first, one at a time (each needs its own
calibration), then the combinations of GPTQ and bias correction on the chosen graph. A method
is kept only when it raises the score by at least :data:`MARGIN_DB`; a tie keeps the simpler
setting. Per layer, GPTQ's gain is the SQNR of each layer's own output under weight rounding
(``tr(W H W^T) / tr(dW H dW^T)`` with the calibration Hessian ``H``), round to nearest against
GPTQ, at the narrowest format; it costs no pass.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from mpsearch.assignment import table_format, uniform_assignment
from mpsearch.data import Dataset
from mpsearch.evaluate import Evaluator
from mpsearch.graph import ModelGraph
from mpsearch.profiles import HardwareProfile, runs_fused_int8
from mpsearch.progress import Progress, Reporter
from mpsearch.quantize import Quantizer
from mpsearch.recovery._activations import sum_together
from mpsearch.recovery._bias_correction import InputMeans, input_means, means_reduction
from mpsearch.recovery._cle import equalization_pairs, equalize
from mpsearch.recovery._corrected import CorrectedQuantizer
from mpsearch.recovery._gptq import (
    HESSIAN_SAMPLES,
    InputHessians,
    hessians_reduction,
    input_hessians,
)
from mpsearch.recovery._layers import layer_gains
from mpsearch.recovery._smoothquant import (
    ChannelMaxima,
    channel_maxima,
    smooth,
    smoothing_groups,
)

if TYPE_CHECKING:
    from mpsearch.calibration import CalibrationTable

__all__ = ["DECISION_SAMPLES", "MARGIN_DB", "METHODS", "OUTLIER_RATIO", "Recovered",
           "RecoveryDecision", "RecoverySettings", "recover"]

logger = logging.getLogger(__name__)

#: The recovery methods, in the order they are decided.
METHODS = ("cle", "smoothquant", "gptq", "bias_correction")
#: Search-split samples each candidate is scored on.
DECISION_SAMPLES = 64
#: Score gain (dB of mean output SQNR) a method must bring to be kept.
MARGIN_DB = 0.1
#: A LayerNorm output has outlier channels when its largest channel maximum is at least this
#: many times its median one.
OUTLIER_RATIO = 6.0

Calibrate = Callable[[ModelGraph], "CalibrationTable"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoverySettings:
    """What was asked per method: True (on), False (off) or None (``auto``: decided)."""

    cle: bool | None = None
    bias_correction: bool | None = None
    gptq: bool | None = None
    smoothquant: bool | None = None
    smoothquant_alpha: float = 0.5

    @property
    def auto(self) -> bool:
        return None in (self.cle, self.bias_correction, self.gptq, self.smoothquant)


@dataclass(frozen=True, slots=True, kw_only=True)
class RecoveryDecision:
    """The methods on, why each is on or off, and the scores of every candidate tried.

    ``scores``: candidate (``plain``, ``cle``, ``gptq+bias_correction``, ...) -> format ->
    model-output SQNR (dB) and primary metric on the search samples; ``layers``: node ->
    weight-rounding SQNR of its own output (dB), round to nearest and GPTQ."""

    chosen: Mapping[str, bool]
    asked: Mapping[str, str]
    reasons: Mapping[str, str]
    formats: tuple[str, ...]
    samples: int
    metric: str
    scores: Mapping[str, Mapping[str, Mapping[str, float]]]
    layers: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    seconds: float = 0.0

    def score(self, candidate: str) -> float:
        """Mean output SQNR (dB) of ``candidate`` over the formats (NaN when not scored)."""
        rows = self.scores.get(candidate)
        return _mean(rows) if rows else math.nan

    @property
    def label(self) -> str:
        """The methods on, joined by ``+`` (``plain`` when none)."""
        return _label({m: self.chosen[m] for m in METHODS})

    def summary(self) -> str:
        """One line: the methods on and what they bought against plain."""
        gain = self.score(self.label) - self.score("plain")
        bought = ("" if math.isnan(gain) or self.label == "plain"
                  else f" (+{gain:.2f} dB mean output SQNR over plain at "
                       f"{'/'.join(self.formats)})")
        off = [f"{m}: {self.reasons[m]}" for m in METHODS
               if not self.chosen[m] and self.asked[m] == "auto"]
        return f"{self.label}{bought}" + (f"; off: {'; '.join(off)}" if off else "")

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": dict(self.chosen), "label": self.label, "asked": dict(self.asked),
                "reasons": dict(self.reasons), "formats": list(self.formats),
                "samples": self.samples, "metric": self.metric,
                "scores": {c: {f: dict(v) for f, v in s.items()}
                           for c, s in self.scores.items()},
                "mean_sqnr_db": {c: self.score(c) for c in self.scores},
                "layers": {n: dict(v) for n, v in self.layers.items()},
                "seconds": self.seconds, "summary": self.summary()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RecoveryDecision:
        return cls(chosen=dict(data["chosen"]), asked=dict(data["asked"]),
                   reasons=dict(data["reasons"]), formats=tuple(data["formats"]),
                   samples=int(data["samples"]), metric=str(data["metric"]),
                   scores=data["scores"], layers=data.get("layers", {}),
                   seconds=float(data.get("seconds", 0.0)))


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered:
    """What the run quantizes with: the (equalized, smoothed) graph, its calibration table,
    bias correction's means and GPTQ's Hessians (None when off), and the decision (None when
    every method was fixed)."""

    graph: ModelGraph
    table: CalibrationTable
    means: InputMeans | None = None
    hessians: InputHessians | None = None
    decision: RecoveryDecision | None = None


def _label(on: Mapping[str, bool]) -> str:
    names = [m for m in METHODS if on.get(m)]
    return "+".join(names) if names else "plain"


def _mean(rows: Mapping[str, Mapping[str, float]]) -> float:
    values = [r.get("sqnr") for r in rows.values()]
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite and len(finite) == len(values) else math.nan


def scored_formats(graph: ModelGraph, profile: HardwareProfile) -> tuple[str, ...]:
    """The profile's integer formats with weights of at most 8 bits, narrowest and widest
    activation (one name when they are the same): where GPTQ and bias correction act."""
    found = []
    for name, fmt in profile.formats.items():
        w, a = fmt.weight, fmt.activation
        if w.is_float or a.is_float or w.bits > 8 or table_format(graph, profile, name):
            continue
        if any(name in profile.formats_for_node(n) for n in graph.quantizable_nodes()):
            found.append((a.bits, name))
    if not found:
        return ()
    found.sort()
    return tuple(dict.fromkeys((found[0][1], found[-1][1])))


class _Scorer:
    """Scores candidates on the search samples against one FP32 reference pass."""

    def __init__(self, graph: ModelGraph, profile: HardwareProfile, data: Dataset, *,
                 metric: str | None, threads: int, formats: tuple[str, ...],
                 progress: Reporter | None, total: int) -> None:
        self.evaluator = Evaluator(graph, data, metric=metric, threads=threads,
                                   fused_int8=runs_fused_int8(profile))
        self.profile, self.threads, self.formats = profile, threads, formats
        self.scores: dict[str, dict[str, dict[str, float]]] = {}
        self.models: dict[str, dict[str, onnx.ModelProto]] = {}
        self.progress, self.total, self.done = progress, total, 0

    def __call__(self, name: str, quantizer: Quantizer) -> float:
        rows: dict[str, dict[str, float]] = {}
        for fmt in self.formats:
            model = quantizer.build(uniform_assignment(quantizer.graph, self.profile, fmt))
            # the measurers' pooled session: an arena of its own kept a run's whole pattern
            metrics = self.evaluator.evaluate(model).metrics
            rows[fmt] = {"sqnr": float(metrics["sqnr"]),
                         self.evaluator.primary.name: float(metrics[self.evaluator.primary.name])}
            self.models.setdefault(name, {})[fmt] = model
            self.done += 1
            if self.progress is not None:
                self.progress(Progress(stage="recovery", done=self.done,
                                       total=max(self.total, self.done), unit="builds"))
        self.scores[name] = rows
        logger.info("recovery %s: %s", name, rows)
        return _mean(rows)

    def score(self, name: str) -> float:
        """The mean output SQNR (dB) of a candidate already scored."""
        return _mean(self.scores[name])


def _better(new: float, old: float) -> bool:
    return math.isfinite(new) and (not math.isfinite(old) or new >= old + MARGIN_DB)


def _asked(value: bool | None) -> str:
    return "auto" if value is None else "on" if value else "off"


def recover(graph: ModelGraph, profile: HardwareProfile, calibration: Dataset,
            search: Dataset, calibrate: Calibrate, settings: RecoverySettings, *,
            metric: str | None = None, threads: int = 2,
            progress: Reporter | None = None) -> Recovered:
    """Apply the recovery ``settings`` to ``graph``, deciding the ``None`` ones on the first
    :data:`DECISION_SAMPLES` samples of ``search`` (see the module docstring)."""
    start = time.perf_counter()
    s = settings
    if not s.auto:
        return _fixed(graph, calibration, calibrate, s, threads)
    asked = {m: _asked(getattr(s, m)) for m in METHODS}
    reasons = {m: "" if asked[m] == "auto" else f"set {asked[m]}" for m in METHODS}
    formats = scored_formats(graph, profile)
    if not formats:
        reasons.update({m: "no integer format with 8-bit weights to score" for m in METHODS
                        if asked[m] == "auto"})
        fixed = {m: bool(getattr(s, m)) for m in METHODS}
        done = _fixed(graph, calibration, calibrate,
                      RecoverySettings(**fixed, smoothquant_alpha=s.smoothquant_alpha), threads)
        decision = RecoveryDecision(chosen=fixed, asked=asked, reasons=reasons, formats=(),
                                    samples=0, metric=metric or "", scores={},
                                    seconds=time.perf_counter() - start)
        return Recovered(graph=done.graph, table=done.table, means=done.means,
                         hessians=done.hessians, decision=decision)
    data = search.take(min(len(search), DECISION_SAMPLES))
    scorer = _Scorer(graph, profile, data, metric=metric, threads=threads, formats=formats,
                     progress=progress, total=len(formats) * 6)
    chosen = dict.fromkeys(METHODS, False)
    table = calibrate(graph)
    current = scorer("plain", Quantizer(graph, table, profile))
    graph, table, _ = _transforms(graph, profile, calibration, calibrate, s, scorer, chosen,
                                  reasons, (table, current), threads)
    means, hessians = _weights(graph, table, profile, calibration, s, scorer, chosen, reasons,
                               threads)
    layers = {}
    if hessians is not None:  # GPTQ's per-layer gain, from the two narrowest-format builds
        base = {m: chosen[m] for m in ("cle", "smoothquant")}
        rtn = scorer.models.get(_label(base), {}).get(formats[0])
        gptq = scorer.models.get(_label(dict(base, gptq=True)), {}).get(formats[0])
        if rtn is not None and gptq is not None:
            layers = layer_gains(graph, hessians, rtn, gptq)
        hessians.release_factors()  # the scored grids are rounded: their codes are memoized
    decision = RecoveryDecision(
        chosen=chosen, asked=asked, reasons=reasons, formats=formats, samples=len(data),
        metric=scorer.evaluator.primary.name, scores=scorer.scores, layers=layers,
        seconds=time.perf_counter() - start)
    logger.info("recovery auto: %s", decision.summary())
    return Recovered(graph=graph, table=table, means=means if chosen["bias_correction"] else None,
                     hessians=hessians if chosen["gptq"] else None, decision=decision)


def _fixed(graph: ModelGraph, calibration: Dataset, calibrate: Calibrate,
           s: RecoverySettings, threads: int) -> Recovered:
    """The explicit settings applied as they are (no measurement)."""
    if s.cle:
        graph = equalize(graph)
    if s.smoothquant:
        graph = smooth(graph, channel_maxima(graph, calibration, threads=threads),
                       alpha=s.smoothquant_alpha)
    table = calibrate(graph)
    means, hessians = _statistics(graph, calibration, means=bool(s.bias_correction),
                                  hessians=bool(s.gptq), threads=threads)
    return Recovered(graph=graph, table=table, means=means, hessians=hessians)


def _statistics(graph: ModelGraph, calibration: Dataset, *, means: bool, hessians: bool,
                threads: int) -> tuple[InputMeans | None, InputHessians | None]:
    """Bias correction's input means and GPTQ's Hessians, as wanted: in one FP32 pass when
    both are and the Hessians take every calibration sample (at most :data:`HESSIAN_SAMPLES`:
    small data, where a pass is a fixed cost), else each in its own."""
    if means and hessians and len(calibration) <= HESSIAN_SAMPLES:
        mean_sums, to_means = means_reduction(graph)
        hessian_sums, to_hessians = hessians_reduction(graph, len(calibration))
        summed = sum_together(graph, calibration, [mean_sums, hessian_sums], threads=threads,
                              label=f"{graph.name} (bias correction means, GPTQ Hessians)")
        return to_means(summed[0]), to_hessians(summed[1])
    return (input_means(graph, calibration, threads=threads) if means else None,
            input_hessians(graph, calibration, threads=threads) if hessians else None)


def _outlier_ratio(maxima: ChannelMaxima) -> float:
    """The largest (largest / median channel maximum) over the smoothable LayerNorm outputs."""
    ratios = [float(m.max() / max(float(np.median(m)), 1e-12)) for m in maxima.maxima.values()
              if m.size]
    return max(ratios, default=0.0)


def _transforms(graph: ModelGraph, profile: HardwareProfile, calibration: Dataset,
                calibrate: Calibrate, s: RecoverySettings, scorer: _Scorer,
                chosen: dict[str, bool], reasons: dict[str, str],
                state: tuple[CalibrationTable, float], threads: int
                ) -> tuple[ModelGraph, CalibrationTable, float]:
    """CLE, then SmoothQuant: each applied when set on, tried when auto and it applies."""
    table, current = state
    for method in ("cle", "smoothquant"):
        value = getattr(s, method)
        if value is False:
            continue
        if method == "cle":
            pairs = len(equalization_pairs(graph)[0])
            applies = pairs > 0
            why = (f"{pairs} Conv pairs to equalize" if applies
                   else "no Conv -> Relu/Clip -> Conv pair to equalize")
        else:
            groups = len(smoothing_groups(graph)[0])
            maxima = channel_maxima(graph, calibration, threads=threads) if groups else None
            ratio = 0.0 if maxima is None else _outlier_ratio(maxima)
            applies = ratio >= OUTLIER_RATIO
            why = ("no LayerNorm read only by MatMul/Gemm weights" if not groups else
                   f"{groups} LayerNorms, largest/median channel maximum {ratio:.1f}")
        if value is None and not applies:
            reasons[method] = why
            continue
        if method == "cle":
            new = equalize(graph)
        else:
            new = smooth(graph, maxima or channel_maxima(graph, calibration, threads=threads),
                         alpha=s.smoothquant_alpha)
        new_table = calibrate(new)
        if value is True:
            graph, table, chosen[method] = new, new_table, True
            current = scorer(_label(chosen), Quantizer(graph, table, profile))
            continue
        trial = dict(chosen, **{method: True})
        score = scorer(_label(trial), Quantizer(new, new_table, profile))
        if _better(score, current):
            reasons[method] = f"{why}; kept: {score - current:+.2f} dB"
            graph, table, current, chosen[method] = new, new_table, score, True
        else:
            reasons[method] = f"{why}; did not help ({score - current:+.2f} dB)"
    return graph, table, current


def _weights(graph: ModelGraph, table: CalibrationTable, profile: HardwareProfile,
             calibration: Dataset, s: RecoverySettings, scorer: _Scorer,
             chosen: dict[str, bool], reasons: dict[str, str], threads: int
             ) -> tuple[InputMeans | None, InputHessians | None]:
    """GPTQ and bias correction: every combination of the auto ones scored, the best kept."""
    options = {m: [getattr(s, m)] if getattr(s, m) is not None else [False, True]
               for m in ("gptq", "bias_correction")}
    means, hessians = _statistics(graph, calibration,
                                  means=True in options["bias_correction"],
                                  hessians=True in options["gptq"], threads=threads)
    if hessians is not None and not hessians.hessians and s.gptq is None:
        options["gptq"] = [False]
        reasons["gptq"] = "no Conv/Gemm/MatMul weight to round"
    best: tuple[bool, bool] | None = None
    for gptq in options["gptq"]:  # False first: the simpler setting wins a tie
        for bc in options["bias_correction"]:
            name = _label(dict(chosen, gptq=gptq, bias_correction=bc))
            score = (scorer.score(name) if name in scorer.scores else scorer(
                name, CorrectedQuantizer(graph, table, profile, means=means if bc else None,
                                         hessians=hessians if gptq else None)))
            if best is None or _better(score, scorer.score(_label(
                    dict(chosen, gptq=best[0], bias_correction=best[1])))):
                best = (gptq, bc)
    assert best is not None
    chosen["gptq"], chosen["bias_correction"] = best
    for method in ("gptq", "bias_correction"):
        if reasons[method]:  # set, or not applicable
            continue
        flipped = _label(dict(chosen, **{method: not chosen[method]}))
        delta = scorer.score(_label(chosen)) - scorer.score(flipped)
        reasons[method] = (f"kept: {delta:+.2f} dB over the same without it" if chosen[method]
                           else f"did not help: {-delta:+.2f} dB with it (margin {MARGIN_DB} dB)")
    return means, hessians
