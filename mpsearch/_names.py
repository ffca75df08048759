"""Fresh names for what a graph edit adds: never one the model, or the edit, already uses.

A model may name its own tensors like the ones a build adds (``c1__raw``, ``x__u8``,
``w__i8c0_dq``), and onnx.checker accepts it. Every name mpsearch adds to a model therefore comes
from a :class:`Namer` built from every name in that model (node names, node inputs and outputs,
initializers, graph inputs, outputs and value_info, in subgraphs at any depth): the wanted name
when it is free, else the first free variant ``<name>_2``, ``<name>_3``, ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import onnx

__all__ = ["Namer", "model_names"]


class Namer:
    """The names taken (in a model, in a parent :class:`Namer`, and handed out since) and a
    source of fresh ones.

    A child namer sees its parent's names but keeps its own to itself: a :class:`Quantizer`
    holds the names of the model and of its cached stored weights, each build a child for the
    names only that build's model holds.
    """

    __slots__ = ("_model", "_parent", "_taken")

    def __init__(self, taken: Iterable[str] = (), *, parent: Namer | None = None) -> None:
        self._taken: set[str] = set(taken)
        self._parent = parent
        self._model: onnx.ModelProto | onnx.GraphProto | None = None

    @classmethod
    def of_model(cls, model: onnx.ModelProto | onnx.GraphProto) -> Namer:
        """A namer holding every name of ``model`` (subgraphs included), read when first
        asked: a pass that names nothing new never walks a large model."""
        namer = cls()
        namer._model = model
        return namer

    def _names(self) -> set[str]:
        if self._model is not None:
            self._taken |= model_names(self._model)
            self._model = None
        return self._taken

    def child(self) -> Namer:
        """A namer that sees this one's names (now and later) and adds its own apart."""
        return Namer(parent=self)

    def taken(self, name: str) -> bool:
        """Whether ``name`` is used here or in a parent."""
        return name in self._names() or (self._parent is not None and self._parent.taken(name))

    def reserve(self, name: str) -> None:
        """Mark ``name`` as used (a name kept from the source model, say)."""
        self._names().add(name)

    def fresh(self, want: str, suffixes: Sequence[str] = ("",), *,
              avoid: Namer | None = None) -> str:
        """The first stem of ``want``, ``want_2``, ``want_3``, ... for which stem + every
        suffix is free here (and in ``avoid``); all of them are then reserved. A group of names
        (``x__u8_q``, ``x__u8_scale``, ...) so keeps one stem."""
        stem, n = want, 1
        while any(self.taken(stem + s) or (avoid is not None and avoid.taken(stem + s))
                  for s in suffixes):
            n += 1
            stem = f"{want}_{n}"
        self._names().update(stem + s for s in suffixes)
        return stem


def model_names(model: onnx.ModelProto | onnx.GraphProto) -> set[str]:
    """Every name in ``model``: node names, node inputs and outputs, initializers (sparse ones
    too), graph inputs, outputs and value_info, in subgraphs at any depth."""
    graph = model.graph if isinstance(model, onnx.ModelProto) else model
    return set(_names(graph)) - {""}


def _names(graph: onnx.GraphProto) -> Iterator[str]:
    stack = [graph]
    while stack:  # iterative: a deeply nested If must not exhaust the recursion limit
        g = stack.pop()
        yield from (i.name for i in g.initializer)
        yield from (s.values.name for s in g.sparse_initializer)
        yield from (v.name for v in (*g.input, *g.output, *g.value_info))
        for node in g.node:
            yield node.name
            yield from node.input
            yield from node.output
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    stack.append(attr.g)
                stack.extend(attr.graphs)
