"""The one place where the stages are composed; the CLI and the web server call only this.

``prepare`` loads and checks a spec's model, profile and data, splits the data and calibrates
once (cached in the run directory); ``analyze_run``, ``search_run``, ``export_point`` and
``quantize_one`` compose the stages after it, each with one shared
:class:`~mpsearch.analysis.Measurer` per data split, and write the run directory through
:class:`~mpsearch.rundir.RunDir`. The stages themselves take (graph, profile, table, data) and
know nothing of specs, run directories or each other.

One module per command: ``_prepare`` (what every command shares), ``_analyze``, ``_search``
and ``_export`` (a front point, one quantized model, calibrate, evaluate, dry run); ``_llm``
composes the language-model path (its own spec, search and export).
"""

from mpsearch._io import write_model
from mpsearch._results import write_analysis
from mpsearch.pipeline._analyze import REPORT_VIEW_NODES, analyze_prepared, analyze_run
from mpsearch.pipeline._export import (
    BuiltModel,
    DryRun,
    calibrate_model,
    dry_run,
    evaluate_model,
    export_point,
    quantize_one,
)
from mpsearch.pipeline._llm import (
    LLMSpec,
    llm_export,
    llm_search_run,
    load_llm_spec,
    read_llm_front,
)
from mpsearch.pipeline._prepare import Prepared, prepare, prepare_inputs, search_split, split_data
from mpsearch.pipeline._search import (
    SearchRun,
    check_profile_claims,
    search_run,
    toolchain_missing,
    with_objectives,
)

__all__ = ["REPORT_VIEW_NODES", "BuiltModel", "DryRun", "LLMSpec", "Prepared", "SearchRun",
           "analyze_prepared", "analyze_run", "calibrate_model", "check_profile_claims",
           "dry_run", "evaluate_model", "export_point", "llm_export", "llm_search_run",
           "load_llm_spec", "prepare", "prepare_inputs", "quantize_one", "read_llm_front",
           "search_run", "search_split", "split_data", "toolchain_missing", "with_objectives",
           "write_analysis", "write_model"]
