"""The recorded fixtures that come in pairs: a pathological script, the rules that diagnose it, and its fixed twin.

The twin's measured speed-up (each script times its own steady-state steps, run plainly on the recording
machine: fixtures/measurements.json) is the truth that the rules' predicted saving is checked against
(bench/validate_impacts.py), and the twin must not draw those rules' warnings
(tests/builtin_rules/test_rules_fixtures.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FixturePair:
    rules: tuple[str, ...]  # the rules whose summed impact predicts the twin's gain
    bad: str
    fixed: str
    # Compare time per sample: the twin makes its steps larger on purpose. The prediction is then the saving per
    # sample of a larger batch that GD301's evidence gives, not the share of the step its impact claims.
    per_sample: bool = False
    # The evidence (a step in ms) the twin's step is predicted by, instead of the rules' impact: a finding with two
    # fixes gives the step after the other as evidence (GD311's "step with bf16 autocast (est.)").
    what_if: str | None = None
    # The twin applies the fix of every problem the bad run shows: the verdict's saving together (report.verdict.
    # saving_together) is checked against it too, beside the pair's rules' own.
    together: bool = False
    # The evidence (a share in %) the twin's saving is predicted by, where the finding's cost is not a saving of
    # each step: a stall rarer than the step's pace counts, given as its share of the job's time (GD701).
    share_of: str | None = None
    # The start-up phase (analysis.startup's PHASES) the fix shortens, where its cost is paid once: the twin's
    # gain is how much shorter that phase is in its bundle, the prediction the share given as `share_of`.
    startup_phase: str | None = None


PAIRS = (
    FixturePair(("GD101",), "data_starvation_bad", "data_starvation_fixed", together=True),
    FixturePair(("GD102",), "data_starvation_workers_bad", "data_starvation_workers_fixed", together=True),
    FixturePair(("GD102",), "classifier_few_workers_bad", "classifier_few_workers_fixed", together=True),
    FixturePair(("GD101",), "tensor_dataset_bad", "tensor_dataset_fixed"),
    FixturePair(("GD103",), "data_starvation_cpu_bound_bad", "data_starvation_cpu_bound_fixed", together=True),
    FixturePair(("GD201",), "blocking_copy_bad", "blocking_copy_fixed"),
    FixturePair(("GD201",), "loader_pageable_bad", "loader_pageable_fixed", together=True),
    FixturePair(("GD203",), "blocking_copy_d2h_bad", "blocking_copy_d2h_fixed", together=True),
    FixturePair(("GD204",), "blocking_copy_fixed", "blocking_copy_prefetch"),
    FixturePair(("GD201", "GD203"), "inference_pageable_bad", "inference_pageable_fixed", together=True),
    FixturePair(("GD211",), "sync_point_bad", "sync_point_fixed"),
    FixturePair(("GD211",), "lm_manual_sgd_bad", "lm_manual_sgd_fixed"),
    FixturePair(("GD211",), "gan_two_optimizers_bad", "gan_two_optimizers_fixed"),
    FixturePair(("GD211",), "amp_scaler_bad", "amp_scaler_fixed", together=True),
    # These twins replay their steps as CUDA graphs, where GD301's fix is compiling the model: its evidence gives
    # the step with CUDA graphs beside that.
    FixturePair(("GD301",), "small_batch_bad", "small_batch_graphed", what_if="step with CUDA graphs (est.)"),
    FixturePair(("GD301",), "tiny_batch_ops_bad", "tiny_batch_ops_graphed", what_if="step with CUDA graphs (est.)"),
    FixturePair(("GD301",), "small_batch_bad", "small_batch_fixed", per_sample=True),
    FixturePair(("GD301",), "tiny_batch_ops_bad", "tiny_batch_ops_fixed", per_sample=True),
    FixturePair(("GD501",), "gil_contention_bad", "gil_contention_fixed", together=True),
    FixturePair(("GD501",), "threadpool_inference_bad", "threadpool_inference_fixed", together=True),
    FixturePair(("GD503",), "cpu_oversubscription_bad", "cpu_oversubscription_fixed"),
    FixturePair(("GD504",), "cpu_contention_bad", "cpu_contention_fixed", together=True),
    FixturePair(("GD311",), "precision_fp32_bad", "precision_tf32_fixed", together=True),
    FixturePair(("GD311",), "precision_fp32_bad", "precision_bf16_fixed", what_if="step with bf16 autocast (est.)"),
    FixturePair(("GD312",), "optimizer_foreach_bad", "optimizer_fused_fixed"),
    FixturePair(("GD313",), "elementwise_eager_bad", "elementwise_compiled_fixed", together=True),
    FixturePair(("GD701",), "checkpoint_stall_bad", "checkpoint_stall_fixed", together=True),
    FixturePair(("GD314",), "recompiles_bad", "recompiles_fixed"),
    FixturePair(("GD402",), "allocator_retries_bad", "allocator_expandable_fixed"),
    FixturePair(("GD702",), "startup_workers_bad", "startup_workers_fixed", together=True),
    FixturePair(("GD312", "GD301"), "optimizer_foreach_bad", "optimizer_fused_compiled_fixed", together=True),
    FixturePair(("GD701",), "eval_checkpoint_bad", "eval_checkpoint_fixed", share_of="share of the job's time"),
    FixturePair(("GD702",), "oversubscribed_workers_bad", "oversubscribed_workers_fixed",
                share_of="of the workers' starts (est.)", startup_phase="loader_workers"),
    FixturePair(("GD315",), "precision_tf32_gpt_bad", "precision_tf32_gpt_bf16_fixed", together=True),
    FixturePair(("GD315",), "precision_tf32_fixed", "precision_bf16_fixed", together=True),
)
# cudnn_benchmark_off and _on, the neutral knob, are no pair: no rule may advise it.
