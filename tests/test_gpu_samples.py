"""benchmarks/gpu_samples.py: a line per GPU from multigpu_check.sh's nvidia-smi samples, in the
format the sampler wrote on a 2-GPU H100 host (2026-11-27)."""

from __future__ import annotations

from benchmark_scripts import load_script

samples = load_script("benchmarks/gpu_samples.py")

A, B = "GPU-85283b1f-8343-2cd7-23af-32c93a89d069", "GPU-84d9e1f4-f6e3-6970-4fba-391dca84131e"


def sample(stamp: str, apps: list[tuple[str, str, int]], utils: tuple[int, int]) -> list[str]:
    lines = [f"{stamp} app, {pid}, {gpu}, {mib} MiB\n" for pid, gpu, mib in apps]
    lines += [f"{stamp} gpu, {i}, {gpu}, {u} %, 1980 MHz, 150.00 W\n" for i, (gpu, u) in enumerate(zip((A, B), utils))]
    return lines


def test_utilization_counts_only_the_samples_where_a_process_held_the_gpu():
    lines = (
        sample("2026-11-27T05:49:42", [], (0, 0))  # start-up: nothing on either GPU
        + sample("2026-11-27T05:49:44", [("7525", A, 518), ("7526", B, 518)], (0, 0))  # CUDA context only
        + sample("2026-11-27T05:49:46", [("7525", A, 14524), ("7526", B, 15008)], (12, 20))
        + sample("2026-11-27T05:49:48", [("7525", A, 14524), ("7526", B, 15008)], (18, 100))
        + sample("2026-11-27T05:49:50", [("7525", A, 14524), ("9051", A, 3178), ("7526", B, 15008)], (100, 30))
    )
    gpus = samples.read(lines)
    assert set(gpus) == {"85283b1f", "84d9e1f4"}
    assert gpus["85283b1f"].pids == {"7525", "9051"} and gpus["84d9e1f4"].pids == {"7526"}
    out = samples.summary(gpus)
    assert out == [
        "gpu 0 (85283b1f): pids 7525 9051; 5 samples, 3 while the run held it: utilization.gpu median 18%, mean 43%",
        "gpu 1 (84d9e1f4): pids 7526; 5 samples, 3 while the run held it: utilization.gpu median 30%, mean 50%",
    ]


def test_a_gpu_no_process_held_and_lines_of_other_shapes():
    lines = ["2026-11-27T05:49:42 app, Failed to initialize NVML: Unknown Error\n", "garbage\n", "\n"]
    lines += sample("2026-11-27T05:49:44", [("3485", A, 14000)], (14, 0))
    out = samples.summary(samples.read(lines))
    assert out[0].endswith("1 samples, 1 while the run held it: utilization.gpu median 14%, mean 14%")
    assert out[1] == "gpu 1 (84d9e1f4): pids none; 1 samples, none while a process held it"
    assert samples.summary(samples.read(["garbage\n"])) == ["gpu samples: none"]


def test_the_command_line_reads_a_file_and_says_when_it_cannot(tmp_path, capsys):
    path = tmp_path / "gpu-samples-w2.txt"
    path.write_text("".join(sample("2026-11-27T05:49:46", [("7525", A, 14524)], (12, 0))))
    assert samples.main([str(path), "--held-mib", "20000"]) == 0
    assert "none while a process held it" in capsys.readouterr().out.splitlines()[0]
    assert samples.main([str(tmp_path / "missing.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err
