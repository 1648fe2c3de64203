from __future__ import annotations

from serving.cli import main


def test_generate_prints_the_completion(tiny_hf, capsys):
    assert main(["generate", "w5 w6 w7", "--model", tiny_hf[0], "--dtype", "fp32", "--max-tokens", "4", "--raw"]) == 0
    words = capsys.readouterr().out.split()
    assert len(words) == 4 and all(w.startswith("w") for w in words)


def test_bad_arguments_give_one_line_errors(capsys):
    assert main(["generate", "hi", "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autotuned-serve: error: unknown model") and "\n" not in err
    assert main(["generate", "hi", "--model", "tiny", "--max-tokens", "0"]) == 2
    assert "max_tokens must be at least 1" in capsys.readouterr().err


def test_a_device_without_cuda_or_unknown_is_a_one_line_error(capsys):
    """--device reaches the settings; where CUDA is absent (this test's premise) asking for it fails at once."""
    import torch

    if torch.cuda.is_available():
        return
    assert main(["--device", "cuda", "--port", "1"]) == 2
    assert capsys.readouterr().err.strip() == "autotuned-serve: error: device cuda: CUDA is not available on this machine"
    assert main(["serve", "--device", "tpu"]) == 2
    assert "device must be cpu, cuda or cuda:N" in capsys.readouterr().err


def test_the_command_line_sets_openmps_wait_policy_before_torch_loads():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads: the engine must set it first (passive, so
    that torch's threads do not spin on the cores the CPU kernels' pool runs on next)."""
    import os
    import subprocess
    import sys

    spy = ("import os, sys\n"
           "class Spy:\n"
           "    def find_spec(self, name, path=None, target=None):\n"
           "        if name == 'torch':\n"
           "            print(os.environ.get('OMP_WAIT_POLICY'))\n"
           "            sys.meta_path.remove(self)\n"
           "sys.meta_path.insert(0, Spy())\n"
           "import serving.cli\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", spy], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["PASSIVE"]


def test_a_what_if_on_long_prompts_picks_the_slo_class_it_can_meet(capsys):
    """Summarization on the CPU's calibration meets the interactive class (2 s TTFT) at no rate: without
    --slo-* or --qps the what-if judges it at the next shipped class, strictest first, and says so; an
    explicit SLO it cannot meet is a one-line error that names the fix."""
    import json

    assert main(["simulate", "--workload", "summarization", "--requests", "20"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["slo"] == {"ttft_s": 30.0, "tbt_s": 2.0}
    assert "judged at the 'batch' SLO class" in out.err
    assert main(["simulate", "--workload", "summarization", "--requests", "20", "--slo-ttft-s", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("autotuned-serve: error: the modelled machine meets the SLO") and "give --qps" in err
