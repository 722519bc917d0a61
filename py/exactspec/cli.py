"""Command line: `exactspec demo | generate | sample`. Errors are one coded line, never a traceback."""
from __future__ import annotations

import argparse
import json
import os
import sys

from .errors import E_BAD_ARGUMENT, ExactSpecError

EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL = 1, 2, 70


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise ExactSpecError(E_BAD_ARGUMENT, message)


def _add_generation_args(p):
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--champion", default=None, help="champion model directory (default: shipped)")
    p.add_argument("--draft", default=None, help="draft model directory (default: shipped)")
    p.add_argument("--speculate", default="draft", choices=["none", "draft", "lookup"])
    p.add_argument("--k", type=int, default=4, help="proposals per round")
    p.add_argument("--temperature", type=float, default=1.0, help="0 means greedy")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--backend", default="reference", choices=["reference", "browser"],
                   help="reference: CPython/NumPy; browser: headless Chromium (WebGPU champion, WASM draft, Pyodide)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="exactspec", description="Exact speculative decoding (reference backend).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="run the reference generation demo (main job)")
    demo.add_argument("--toy", action="store_true", help="use the NumPy toy models even if real ones exist")
    demo.add_argument("--json", action="store_true")
    serve = sub.add_parser("serve", help="serve the browser runtime on 127.0.0.1 (COOP/COEP, offline)")
    serve.add_argument("--port", type=int, default=8000)
    _add_generation_args(sub.add_parser("generate", help="generate one answer"))
    sample = sub.add_parser("sample", help="N independent samples, seeds derived from --seed")
    _add_generation_args(sample)
    sample.add_argument("--n", type=int, required=True)
    return parser


def _policy(args):
    from .processors import SamplingPolicy
    return SamplingPolicy(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty)


def _load(args):
    from .models import load_pair
    champion, draft = _model_dirs(args)
    return load_pair(champion, draft)


def _prompt_ids(pair, args):
    if args.chat:
        from .chat import check_template, render_chat
        check_template(pair.tokenizer_config.get("chat_template", ""))
        text = render_chat([{"role": "user", "content": args.prompt}], pair.tokenizer_config.get("bos_token", ""))
        return pair.tokenizer.encode(text, add_special_tokens=False)
    return pair.tokenizer.encode(args.prompt, add_special_tokens=True)


def _config(pair, args, seed):
    from .orchestrator import GenerationConfig
    return GenerationConfig(max_new_tokens=args.max_new_tokens, policy=_policy(args), speculate=args.speculate,
                            k=args.k, seed=seed, stop_token_ids=pair.stop_token_ids, stop_strings=tuple(args.stop))


def derive_seed(seed: int, index: int) -> int:
    """Seed of sample `index`: Threefry of (seed, 'SAMP', index), 64 bits."""
    from .rng import threefry2x32
    x0, x1 = threefry2x32((seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF), (0x53414D50, index))
    return x0 | (x1 << 32)


def _model_dirs(args):
    from .models import default_models_dir
    base = default_models_dir()
    champion = args.champion or os.path.join(base, "champion")
    draft = (args.draft or os.path.join(base, "draft")) if args.speculate == "draft" else None
    return champion, draft


def _browser_payload(args, seed: int) -> dict:
    return {"prompt": args.prompt, "chat": args.chat, "config": {
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "repetition_penalty": args.repetition_penalty, "speculate": args.speculate,
        "k": args.k, "seed": seed, "stop_strings": list(args.stop)}}


def _run(args, seeds, on_event=None) -> list:
    """Run one request per seed on the chosen backend; returns result dicts (same shape for both)."""
    if args.backend == "browser":
        from .browser_run import BrowserRuntime
        champion, draft = _model_dirs(args)
        with BrowserRuntime(champion, draft) as rt:
            outs = []
            for seed in seeds:
                out = rt.generate(_browser_payload(args, seed))
                result = dict(out["result"])
                result["timing_ms"] = {**result.get("timing_ms", {}), "load": rt.ready["timing_ms"],
                                       }
                outs.append(result)
            return outs
    pair = _load(args)
    ids = _prompt_ids(pair, args)
    return [pair.orchestrator.generate(ids, _config(pair, args, seed), on_event=on_event).to_dict() for seed in seeds]


def cmd_generate(args) -> int:
    stream = None if args.json else (lambda env: env["kind"] == "tokens" and
                                     (sys.stdout.write(env["payload"]["text"]), sys.stdout.flush()))
    result = _run(args, [args.seed], stream)[0]
    if args.json:
        print(json.dumps(result))
    else:
        if args.backend == "browser":
            sys.stdout.write(result["text"])
        st = result["stats"]
        print()
        print(f"[{result['finish_reason']}] {len(result['token_ids'])} tokens, {st['rounds']} rounds, "
              f"{st['accepted']}/{st['proposed']} accepted, {result['timing_ms']['total']:.0f} ms", file=sys.stderr)
    if result["error"]:
        print(f"exactspec: {result['error']['code']}: {result['error']['message']}", file=sys.stderr)
        return EXIT_ERROR
    return 0


def cmd_sample(args) -> int:
    if args.n < 1:
        raise ExactSpecError(E_BAD_ARGUMENT, "--n must be at least 1")
    results = _run(args, [derive_seed(args.seed, i) for i in range(args.n)])
    samples = [{"token_ids": r["token_ids"], "text": r["text"], "finish_reason": r["finish_reason"],
                "stats": r["stats"], "error": r["error"]} for r in results]
    if args.json:
        print(json.dumps({"prompt_ids": results[0]["prompt_ids"], "samples": samples}))
    else:
        for r in samples:
            print(json.dumps(r["text"]))
    return EXIT_ERROR if any(r["error"] for r in samples) else 0


def main(argv=None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "demo":
            from .demo import run_demo
            return run_demo(toy=args.toy, as_json=args.json)
        if args.command == "serve":
            from .server import serve_forever
            serve_forever("127.0.0.1", args.port)
            return 0
        return {"generate": cmd_generate, "sample": cmd_sample}[args.command](args)
    except ExactSpecError as err:
        print(f"exactspec: {err.code}: {err.message}", file=sys.stderr)
        return EXIT_USAGE if err.code == E_BAD_ARGUMENT else EXIT_ERROR
    except KeyboardInterrupt:
        print("exactspec: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: still one line; EXACTSPEC_DEBUG=1 shows the traceback
        if os.environ.get("EXACTSPEC_DEBUG"):
            raise
        print(f"exactspec: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
