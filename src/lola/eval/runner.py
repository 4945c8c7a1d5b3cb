"""Run the needle-in-a-haystack experiment: every method on the same samples, resumable.

Methods (:mod:`lola.methods`; all but ``full`` share one exact-token budget ``sinks + window + sparse_size``):

- ``full``: stock attention and a growing cache.
- ``window``: sinks + a sliding window of the whole budget, softmax only.
- ``hybrid``: sinks + a sliding window of the whole budget + the linear state (mixed with the
  run's rule, or ``lola_authors`` when that is ``softmax_only``, which would ignore the state).
- ``lola``: sinks + window + sparse cache + linear state, once per scoring policy
  (reported as ``lola-<policy>``), with uniform or calibrated per-head budgets
  (:mod:`lola.budgets`), plus any named ``variants`` (``lola-<name>``): partial
  :class:`~lola.LoLAConfig` settings over the run's own, for comparing policies and
  allocations on the same samples.

The run is written in three parts, and this module gathers them: its spec and the LoLA configs
of its methods (:mod:`lola.eval.niah_spec`), its execution (:mod:`lola.eval.niah_execution`)
with the records it keeps on disk and the checks a resume makes (:mod:`lola.eval.niah_records`),
and its reporting (:mod:`lola.eval.niah_report`).
"""

from __future__ import annotations

from lola.eval.niah_execution import niah_prompts, run_niah
from lola.eval.niah_records import PLOT_FILES, RESULTS_FILE, RESULTS_FORMAT, SAMPLES_FILE, SampleRecord, check_out_folder, sample_depth
from lola.eval.niah_report import format_depth_summary, format_intervals, format_summary, plot_results, summarize, summarize_by_depth, wilson_interval
from lola.eval.niah_spec import NiahRun, check_budgets, default_lola_config, method_configs, run_inputs
from lola.methods import METHODS

__all__ = [
    "METHODS",
    "PLOT_FILES",
    "RESULTS_FILE",
    "RESULTS_FORMAT",
    "SAMPLES_FILE",
    "NiahRun",
    "SampleRecord",
    "check_budgets",
    "check_out_folder",
    "default_lola_config",
    "format_depth_summary",
    "format_intervals",
    "format_summary",
    "method_configs",
    "niah_prompts",
    "plot_results",
    "run_inputs",
    "run_niah",
    "sample_depth",
    "summarize",
    "summarize_by_depth",
    "wilson_interval",
]
