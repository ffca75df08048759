"""The one measurer: build, open and score an assignment once, for the analysis and the search.

Consumes a :class:`~mpsearch.quantize.Quantizer` (graph, calibration table, profile) and an
:class:`~mpsearch.evaluate.Evaluator` (the data and its FP32 outputs); produces a frozen
:class:`Measurement` per (assignment, sample count), cached by :func:`assignment_key` in one
mapping (the run directory's ``cache/measurements.json``), so a configuration the analysis
measured is never measured again by the search, nor by a rerun.

An assignment is measured on the first ``samples`` samples of the evaluator's data (all by
default). A measurement on more samples of the configuration measured last continues from
where that one stopped (the search's early pruning looks at a first chunk, then completes the
survivors) instead of running the first samples again.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx

from mpsearch.analysis._prefix import Cut, FloatPrefix, run_in_chunks
from mpsearch.assignment import assignment_key
from mpsearch.clock import ROUNDS
from mpsearch.data import Dataset
from mpsearch.evaluate import Evaluator, resolve_metric
from mpsearch.profiles import runs_fused_int8
from mpsearch.quantize import Quantizer
from mpsearch.runtime import Session

__all__ = ["Measurement", "Measurer", "assignment_key", "output_kl"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """Metrics of one assignment against FP32, with where the time went."""

    metrics: Mapping[str, float]
    primary: str
    kl: float | None = None
    samples: int = 0
    build_s: float = 0.0
    session_s: float = 0.0
    eval_s: float = 0.0

    @property
    def value(self) -> float:
        return self.metrics[self.primary]

    @property
    def sqnr(self) -> float | None:
        return self.metrics.get("sqnr")

    @property
    def seconds(self) -> float:
        return self.build_s + self.session_s + self.eval_s

    def cost(self, fp32: float, higher_is_better: bool) -> float:
        """What quantizing cost against the FP32 metric ``fp32``: the relative output noise
        power (from the SQNR) plus the metric's loss (never negative); 0 when identical."""
        sqnr = self.metrics.get("sqnr", math.inf)
        noise = 0.0 if not math.isfinite(sqnr) else 10.0 ** (-sqnr / 10.0)
        loss = fp32 - self.value if higher_is_better else self.value - fp32
        return noise + max(loss, 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"metrics": dict(self.metrics), "primary": self.primary, "kl": self.kl,
                "samples": self.samples, "build_s": self.build_s,
                "session_s": self.session_s, "eval_s": self.eval_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """Inverse of :meth:`to_dict` after a JSON round trip (null SQNR is +inf)."""
        metrics = {k: (math.inf if k == "sqnr" else math.nan) if v is None else float(v)
                   for k, v in data["metrics"].items()}
        return cls(metrics=MappingProxyType(metrics), primary=str(data["primary"]),
                   kl=data.get("kl"), samples=int(data.get("samples", 0)),
                   build_s=float(data.get("build_s", 0.0)),
                   session_s=float(data.get("session_s", 0.0)),
                   eval_s=float(data.get("eval_s", 0.0)),
)


def output_kl(reference: np.ndarray, outputs: np.ndarray) -> float | None:
    """Mean KL(softmax(reference) || softmax(outputs)) over samples, for [N, classes] outputs.

    Outputs that are already probabilities (non-negative rows summing to 1) are used as they
    are. None for outputs that are not class scores.
    """
    if reference.ndim != 2 or reference.shape[1] < 2:
        return None
    ref, out = reference.astype(np.float64), outputs.astype(np.float64)
    if (ref >= 0).all() and np.allclose(ref.sum(axis=1), 1.0, atol=1e-3):
        logp = np.log(np.clip(ref, 1e-12, None))
        logq = np.log(np.clip(out, 1e-12, None))
    else:
        logp = ref - ref.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        logq = out - out.max(axis=1, keepdims=True)
        logq -= np.log(np.exp(logq).sum(axis=1, keepdims=True))
    return float(np.mean(np.sum(np.exp(logp) * (logp - logq), axis=1)))


@dataclass(slots=True)
class _Open:
    """The configuration measured last: its model, its session of the whole model (opened on
    first need: a first batch served by the part that differs from FP32 needs none), the
    outputs gathered so far. Sessions draw on the process's warm memory pool."""

    key: str
    model: onnx.ModelProto
    outputs: list[np.ndarray]
    build_s: float
    session_s: float
    eval_s: float
    session: Session | None = None


class Measurer:
    """Scores assignments end to end: one build, one session and one pass per assignment.

    Measures on ``data`` against the FP32 model's outputs, through an
    :class:`~mpsearch.evaluate.Evaluator` made on the first cache miss (so a fully cached
    rerun never runs the FP32 model). ``cache`` maps ``"<assignment_key>@<samples>"`` to
    :meth:`Measurement.to_dict` rows; ``on_new`` is called after each new entry.
    ``evaluations`` counts the configurations measured (cache misses) and ``measured`` lists
    their cache keys in order.

    ``prefix_samples``: measurements on exactly that many first samples
    run only the part of a configuration that differs from FP32, fed with FP32 tensors kept
    once (:class:`~mpsearch.analysis._prefix.FloatPrefix`); their values are the whole
    model's up to float rounding. None (default): every measurement runs the whole model.
    ``partial_runs`` counts the measurements that ran a part.
    """

    def __init__(
        self, quantizer: Quantizer, data: Dataset, *, metric: str | None = None,
        batch_size: int = 64, threads: int = 2,
        cache: MutableMapping[str, Any] | None = None,
        on_new: Callable[[], None] | None = None, prefix_samples: int | None = None,
    ) -> None:
        self.quantizer = quantizer
        self.data = data
        self.metric = metric
        self.batch_size = batch_size
        self.threads = threads
        self.cache: MutableMapping[str, Any] = {} if cache is None else cache
        self.on_new = on_new
        self.evaluations = 0
        self.measured: list[str] = []
        self._evaluator: Evaluator | None = None
        self.prefix_samples = prefix_samples
        self.partial_runs = 0
        self._prefix: FloatPrefix | None = None
        self._open: _Open | None = None

    @property
    def evaluator(self) -> Evaluator:
        """The evaluator over ``data`` (runs the FP32 model once, on first use)."""
        if self._evaluator is None:
            self._evaluator = Evaluator(
                self.quantizer.graph, self.data, metric=self.metric, batch_size=self.batch_size,
                threads=self.threads, fused_int8=runs_fused_int8(self.quantizer.profile))
        return self._evaluator

    @property
    def higher_is_better(self) -> bool:
        """Direction of the primary metric."""
        if self._evaluator is not None:
            return self._evaluator.primary.higher_is_better
        return resolve_metric(self.fp32().primary).higher_is_better

    def canonical(self, formats: Mapping[str, str]) -> dict[str, str]:
        """``formats`` without the nodes left at the profile's float format (the same model)."""
        default = self.quantizer.profile.default_format
        return {node: fmt for node, fmt in formats.items() if fmt != default}

    def count(self, samples: int | None) -> int:
        """How many samples a measurement on the first ``samples`` uses (None: all)."""
        total = len(self.data)
        return total if samples is None else max(1, min(samples, total))

    def fp32(self, samples: int | None = None) -> Measurement:
        """The FP32 model's own metrics on the first ``samples`` samples (SQNR +inf)."""
        count = self.count(samples)
        key = f"fp32@{count}"
        if key not in self.cache:
            evaluator = self.evaluator
            metrics = evaluator.metrics(evaluator.reference[:count])
            self.cache[key] = Measurement(metrics=MappingProxyType(metrics),
                                          primary=evaluator.primary.name, kl=0.0,
                                          samples=count).to_dict()
        return Measurement.from_dict(self.cache[key])

    def measure(self, formats: Mapping[str, str], *, samples: int | None = None) -> Measurement:
        """Metrics of the model with ``formats`` (node -> format; other nodes float) on the
        first ``samples`` samples of the data (all by default)."""
        canonical = self.canonical(formats)
        base = assignment_key(canonical)
        count = self.count(samples)
        key = f"{base}@{count}"
        if key in self.cache:
            return Measurement.from_dict(self.cache[key])
        evaluator = self.evaluator
        state = self._continue(base, canonical)
        outputs = self._run(state, count)
        result = Measurement(
            metrics=MappingProxyType(evaluator.metrics(outputs)), primary=evaluator.primary.name,
            kl=output_kl(evaluator.reference[:count], outputs), samples=len(outputs),
            build_s=state.build_s, session_s=state.session_s, eval_s=state.eval_s,
)
        self.evaluations += 1
        self.measured.append(key)
        self.cache[key] = result.to_dict()
        if self.on_new is not None:
            self.on_new()
        return result

    def cached(self, formats: Mapping[str, str], *, samples: int | None = None
               ) -> Measurement | None:
        """The measurement of ``formats`` on the first ``samples`` samples if already made."""
        key = f"{assignment_key(self.canonical(formats))}@{self.count(samples)}"
        entry = self.cache.get(key)
        return None if entry is None else Measurement.from_dict(entry)

    def outputs(self, formats: Mapping[str, str]) -> np.ndarray:
        """The primary output of the model with ``formats`` on every sample: the outputs the
        last measurement gathered when it was this configuration's (no second pass), else
        one pass."""
        canonical = self.canonical(formats)
        return self._run(self._continue(assignment_key(canonical), canonical), self.count(None))

    def _run(self, state: _Open, count: int) -> np.ndarray:
        """The outputs of ``state``'s configuration on the first ``count`` samples, running
        only the batches it has not run yet: the prefix samples through the part that differs
        from FP32 when the kept FP32 tensors are of those, every other batch whole."""
        output = self.evaluator.output
        start, opening = time.perf_counter(), state.session_s
        done = sum(len(part) for part in state.outputs)
        prefix = None if self.prefix_samples is None else self.count(self.prefix_samples)
        if done == 0 and count == prefix:
            cut = self._cut(state)
            if cut is not None:
                state.outputs.append(self._run_cut(state, cut, count))
                self.partial_runs += 1
                done = count
        for feeds in self.data.batches(self.evaluator.batch_size, start=done,
                                        stop=count):
            session = self._session(state)
            state.outputs.append(session.run(feeds, [output])[output])
            done += len(next(iter(feeds.values()))) if feeds else 0
        state.eval_s += time.perf_counter() - start - (state.session_s - opening)
        return np.concatenate(state.outputs, axis=0)[:count]

    def _cut(self, state: _Open) -> Cut | None:
        """The part of ``state``'s model that differs from FP32 (None: run it whole)."""
        if self.evaluator.fixed_batch is not None:
            return None  # its tensors are gathered in chunks: not always batch-first
        if self._prefix is None:
            count = self.count(self.prefix_samples)
            feeds = next(iter(self.data.batches(count, stop=count)))
            self._prefix = FloatPrefix(self.quantizer.graph, feeds, threads=self.threads,
                                       rows=self.evaluator.batch_size)
        return self._prefix.cut(state.model, self.evaluator.output)

    def _run_cut(self, state: _Open, cut: Cut, count: int) -> np.ndarray:
        if cut.model is None:  # the configuration changes nothing the output depends on
            return self.evaluator.reference[:count].copy()
        start = time.perf_counter()
        session = self.evaluator.session(cut.model)
        state.session_s += time.perf_counter() - start
        output = self.evaluator.output
        return run_in_chunks(session, cut.feeds, [output], self.evaluator.batch_size)[output]

    def release(self) -> None:
        """Drop what this measurer holds for measuring more (the kept FP32 tensors, the last
        configuration's model, session and outputs); its measurements stay cached, and a
        later measurement opens what it needs again."""
        self._prefix = None
        self._open = None

    def latency(self, formats: Mapping[str, str], *, batch: int = 1, repeat: int = ROUNDS
                ) -> float:
        """Median seconds of one ONNX Runtime run of the model with ``formats`` on the first
        ``batch`` samples, of ``repeat`` timed runs after a warm-up (:mod:`mpsearch.clock`);
        cached like the measurements (a rerun does not time again). The session of the
        configuration measured last is reused."""
        canonical = self.canonical(formats)
        base = assignment_key(canonical)
        batch = self.count(batch)
        key = f"{base}@latency{batch}"
        if key not in self.cache:
            state = self._continue(base, canonical)
            feeds = next(iter(self.data.batches(batch, stop=batch)))
            seconds = self._session(state).time_batch(feeds, repeat)
            self.cache[key] = {"seconds": seconds, "batch": batch, "repeat": repeat}
            if self.on_new is not None:
                self.on_new()
        return float(self.cache[key]["seconds"])

    def _continue(self, base: str, formats: Mapping[str, str]) -> _Open:
        """The open state of ``base`` (the configuration measured last), else a new one."""
        if self._open is not None and self._open.key == base:
            return self._open
        start = time.perf_counter()
        model = self.quantizer.build(formats, stand_ins=self.evaluator.stand_ins)
        self._open = _Open(key=base, model=model, outputs=[],
                           build_s=time.perf_counter() - start, session_s=0.0, eval_s=0.0)
        return self._open

    def _session(self, state: _Open) -> Session:
        """``state``'s session of the whole model, opened on first need."""
        if state.session is None:
            start = time.perf_counter()
            state.session = self.evaluator.session(state.model)
            state.session_s += time.perf_counter() - start
        return state.session
