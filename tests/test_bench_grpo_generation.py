"""benchmarks/bench_grpo_generation.py's profile split: the device's kernel time counts each kernel once."""

from __future__ import annotations

from benchmark_scripts import load_script


def test_kernel_time_leaves_out_the_annotation_around_a_compiled_graph():
    """An H200 profile of the compiled decode read 14.15 ms of kernels in a 7.74-ms token step: the
    `## Call CompiledFxGraph` range carried its kernels' device time too. Its averages are given
    device times here as a GPU profile gives them (the CPU profiler records none)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    bench = load_script("benchmarks/bench_grpo_generation.py")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("## Call CompiledFxGraph abc"):
            torch.ones(8).add_(1)
    averages = prof.key_averages()
    annotations = [e for e in averages if e.is_user_annotation]
    kernels = [e for e in averages if not e.is_user_annotation]
    assert len(annotations) == 1 and len(kernels) >= 2
    annotations[0].self_device_time_total = 100.0  # the range: its kernels' time again
    kernels[0].self_device_time_total = 60.0
    kernels[1].self_device_time_total = 40.0
    assert bench.kernel_time_us(averages) == 100.0
