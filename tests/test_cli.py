from __future__ import annotations

from autotuner.cli import main


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
