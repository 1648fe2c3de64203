"""The `autotuned-serve` command line."""

from __future__ import annotations

import argparse
import sys

from engine.errors import EngineError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autotuned-serve", description="A self-tuning LLM serving daemon.")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="generate a completion for one prompt and print it")
    gen.add_argument("prompt", help="the prompt (sent through the model's chat template unless --raw)")
    gen.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    gen.add_argument("--model", default=None,
                     help="a .gguf file, a Hugging Face model directory, or a preset name "
                          "(default: the bundled SmolLM2-135M-Instruct)")
    gen.add_argument("--dtype", default="auto", choices=["auto", "bf16", "fp32"],
                     help="auto: bf16 where the hardware runs it fast, else fp32")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    sub.add_parser("policies", help="list the scheduling policies with the knobs each reads")
    return parser


def run_policies() -> None:
    from policies import POLICIES, Knobs
    from policies.knobs import KNOB_SPECS

    defaults = Knobs()
    for name, cls in POLICIES.items():
        print(f"{name}: {cls.help}")
        for knob in cls.knobs:
            spec = KNOB_SPECS[knob]
            print(f"    {knob:<30} {spec.describe():<16} default {getattr(defaults, knob)!s:<8} {spec.help}")


def run_generate(args: argparse.Namespace) -> None:
    from engine import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    tokenizer = llm.tokenizer
    if args.raw or not tokenizer.chat_template:
        prompt = args.prompt
    else:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
    print(llm.generate([prompt], params, use_tqdm=False)[0].text)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "generate":
            run_generate(args)
        elif args.command == "policies":
            run_policies()
        else:
            parser.print_help()
        return 0
    except (EngineError, ValueError) as e:
        print(f"autotuned-serve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
