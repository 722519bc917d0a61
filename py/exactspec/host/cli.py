"""Command line: `exactspec demo | generate | sample | serve | convert`. Every failure ends in one line
`exactspec: E_CODE: message` on stderr and a non-zero exit, never a traceback."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys

from ..core.errors import E_BAD_ARGUMENT, E_CANCELLED, E_INTERNAL, E_IO, ExactSpecError, message_without_code

EXIT_ERROR, EXIT_USAGE, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_TERMINATED = 1, 2, 70, 130, 143
CHAMPION_WEIGHTS = ("q8", "f32")   # q8: model.q8.safetensors, the artifact the browser page runs


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        raise ExactSpecError(E_BAD_ARGUMENT, message)


def _model_dir_arg(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("must be a model folder or a .gguf file, not an empty string")
    return value


def _port_arg(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a TCP port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (0..65535; 0 picks a free one)")
    return port


def _add_generation_args(p):
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--raw-text", action="store_true",
                   help="never parse special tokens (<|im_end|>, ...) written in the prompt; by default they are "
                        "parsed, as transformers does (with --chat the message text is never parsed)")
    p.add_argument("--champion", default=None, type=_model_dir_arg,
                   help="champion: a Hugging Face folder or a .gguf file (default: shipped)")
    p.add_argument("--draft", default=None, type=_model_dir_arg,
                   help="draft: a folder or a .gguf file (reference backend) (default: the shipped draft, or for a "
                        "GGUF champion the one web/models/manifest.json binds to it)")
    p.add_argument("--weights", default=None, choices=CHAMPION_WEIGHTS,
                   help="champion weights on the reference backend: q8 (default, what the browser runs) or f32")
    p.add_argument("--speculate", default="auto", choices=["auto", "none", "draft", "lookup"],
                   help="auto (default): per round none, prompt lookup or the draft and k, by expected cost per "
                        "token measured on this machine (docs/core.md); the draft is the shipped one, or for a "
                        ".gguf champion the one web/models/manifest.json binds to it (auto: lookup/none without one)")
    p.add_argument("--k", type=int, default=4, help="proposals per round (adaptive: at most; auto ignores it)")
    p.add_argument("--scheduler", default="static", choices=["static", "adaptive"],
                   help="k per round: static (always --k) or adaptive (0..--k from acceptance and round costs)")
    p.add_argument("--temperature", type=float, default=None,
                   help="0 means greedy; else at least 1e-6, as in the browser (f32 maths); default 1, "
                        "but 0 for `generate --chat` (a chat answer is the model's most likely one)")
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--backend", default="reference", choices=["reference", "browser"],
                   help="reference: CPython/NumPy; browser: headless Chromium (champion on WebGPU or WASM, WASM draft, Pyodide)")
    p.add_argument("--champion-backend", default="auto", choices=["auto", "webgpu", "wasm"],
                   help="browser backend only: auto takes WebGPU from a hardware adapter, else the WASM-SIMD champion")
    p.add_argument("--threads", default="auto", type=_threads_arg,
                   help="browser backend, WASM champion: auto (the cores of a cross-origin isolated page, kept only "
                        "when timed faster at load) or a count (docs/browser.md, Threads)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    shape = p.add_mutually_exclusive_group()   # structured output: one response_format (docs/grammar.md)
    shape.add_argument("--json-schema", metavar="FILE", default=None,
                       help="answer with JSON that fits the JSON Schema in FILE")
    shape.add_argument("--regex", metavar="PATTERN", default=None, help="answer with text that matches PATTERN")
    shape.add_argument("--grammar", metavar="FILE", default=None,
                       help="answer with text of the xgrammar EBNF grammar in FILE (a `root` rule)")
    shape.add_argument("--json-object", action="store_true", help="answer with any JSON object")


def _threads_arg(text: str):
    """--threads: "auto" or a count >= 1."""
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be auto or a count >= 1, got {text!r}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="exactspec", description="Exact speculative decoding (reference backend).")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    demo = sub.add_parser("demo", help="the main job: a chat with the real model (SmolLM2, when set-up fetched it), "
                                       "else the browser engine in headless Chromium on the shipped toy pair")
    demo.add_argument("--toy-pair", action="store_true",
                      help="the fast test pair: the browser engine on the shipped toy pair, every mode")
    demo.add_argument("--reference", action="store_true",
                      help="the shipped toy pair on the CPython reference instead of the browser engine")
    demo.add_argument("--toy", action="store_true", help="the CPython reference on NumPy toy models")
    demo.add_argument("--json", action="store_true")
    demo.add_argument("--weights", default="q8", choices=CHAMPION_WEIGHTS,
                      help="reference champion weights (default q8; f32 needs --reference)")
    serve = sub.add_parser("serve", help="serve the browser runtime on 127.0.0.1 (COOP/COEP, offline)")
    serve.add_argument("--port", type=_port_arg, default=8000, help="0..65535; 0 picks a free port")
    serve.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                       help="let pages on this origin (e.g. http://127.0.0.1:9000) load the engine: CORS + CORP cross-origin")
    convert = sub.add_parser("convert", help="a Hugging Face folder to the q8 run artifact and its manifest entry")
    convert.add_argument("src", type=_model_dir_arg, help="Hugging Face model folder (config.json, safetensors)")
    convert.add_argument("dst", type=_model_dir_arg, help="output folder (created; may be SRC)")
    convert.add_argument("--role", default="champion", choices=["champion", "draft"],
                         help="champion: model.q8.safetensors (default); draft: all-F32 model.safetensors (the WASM draft)")
    convert.add_argument("--q8-embedding", action="store_true",
                         help="champion: store the embedding as int8 rows too (default float32, as shipped)")
    convert.add_argument("--json", action="store_true", help="print the manifest entry as JSON")
    _add_generation_args(sub.add_parser("generate", help="generate one answer"))
    sample = sub.add_parser("sample", help="N independent samples, seeds derived from --seed")
    _add_generation_args(sample)
    sample.add_argument("--n", type=int, required=True)
    _add_bench_args(sub.add_parser("bench", help="the preregistered evaluation in headless Chromium (see docs/evaluation.md)"))
    return parser


def _add_bench_args(p):
    p.add_argument("--run", default=None, help="run name: build/eval/<run>/ (default: UTC date-time); an existing run resumes")
    p.add_argument("--split", default="test", choices=["dev", "test"],
                   help="corpus split: dev (tuning runs) or the locked test split (default; every run is counted)")
    p.add_argument("--pairs", default="toy,real",
                   help="model pairs: toy (shipped) and real (SmolLM2-135M-Instruct Q4_1 + its draft; tools/fetch_models.py)")
    p.add_argument("--quick", action="store_true",
                   help="2 prompts, arms champion alone and auto, toy pair on WASM, no wllama: proves the harness")
    p.add_argument("--per-stratum", type=int, default=3, help="prompts per stratum")
    p.add_argument("--real-per-stratum", type=int, default=3, help="prompts per stratum for the real pair")
    p.add_argument("--strata", default="", help="comma-separated strata (default: all)")
    p.add_argument("--backends", default="wasm,webgpu", help="champion backends (webgpu runs a subset)")
    p.add_argument("--real-backends", default="wasm",
                   help="the real pair's champion backends (default wasm: SwiftShader's WebGPU is too slow for it here)")
    p.add_argument("--webgpu-per-stratum", type=int, default=1, help="prompts per stratum on webgpu")
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--max-new-tokens", type=int, default=None, help="override every prompt's length")
    p.add_argument("--samples", type=int, default=150,
                   help="distribution samples: seeds per arm and prompt, toy pair on WASM (0: none)")
    p.add_argument("--webgpu-samples", type=int, default=20, help="the same on WebGPU (0: none)")
    p.add_argument("--real-samples", type=int, default=20, help="the same for the real pair (0: none)")
    p.add_argument("--repeats", type=int, default=1, help="timed passes over the prompts (webgpu: the first only; see --webgpu-gate-repeats)")
    p.add_argument("--gate-repeats", type=int, default=0,
                   help="passes of the gate's arms alone (champion alone, auto, auto's control) up to this many "
                        "(WASM only): the per-stratum gates' cells need more requests than the other arms (the "
                        "report's 'Noise and power')")
    p.add_argument("--webgpu-gate-repeats", type=int, default=4,
                   help="passes of the gate's arms (champion alone, auto) on WebGPU, the first with every arm; at T = 1 "
                        "pass r samples under the prompt's seed + r (eval/gates_v4.json; a test-split run uses its count)")
    p.add_argument("--toy-gate-repeats", type=int, default=None,
                   help="the toy pair's own --gate-repeats (default: --gate-repeats): its short requests are noisier")
    p.add_argument("--load-repeats", type=int, default=3,
                   help="loads of each timed engine (champion alone, champion + draft): the first serves the run, "
                        "the others are timed and unloaded; the report gives their median beside the gate's one load")
    p.add_argument("--engine-pairs", type=int, default=3,
                   help="engine pairs per WASM topology (champion alone's engine and champion + draft's, each loaded "
                        "fresh; repeat r runs on pair r mod n): the intervals resample the pairs, since two engines "
                        "loaded side by side differ by a few per cent (eval/gates_v3.json, v4; a test-split run uses its count)")
    p.add_argument("--no-wllama", dest="wllama", action="store_false", help="leave out the llama.cpp arm")
    p.add_argument("--report-only", action="store_true", help="rewrite the report of an existing --run")
    p.add_argument("--doc", action="store_true", help="write the run into docs/evaluation.md")


MAX_CONSTRAINT_FILE_BYTES = 256 * 1024      # a schema or grammar file (the spec's own limits are smaller)


def _response_format(args):
    """--json-schema / --regex / --grammar / --json-object as a response_format dict (None: none);
    a file is read with a size bound, a schema parsed as JSON, both refused naming the file."""
    from ..formats.config import read_regular_file
    def text_of(path: str, what: str) -> str:
        try:
            return read_regular_file(path, max_bytes=MAX_CONSTRAINT_FILE_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise ExactSpecError(E_BAD_ARGUMENT, f"{what} {path}: not UTF-8 text") from None
    if getattr(args, "json_schema", None):
        text = text_of(args.json_schema, "--json-schema")
        try:
            schema = json.loads(text)
        except ValueError as exc:
            raise ExactSpecError(E_BAD_ARGUMENT, f"--json-schema {args.json_schema}: not JSON ({exc})") from None
        return {"type": "json_schema", "schema": schema}
    if getattr(args, "regex", None) is not None:
        return {"type": "regex", "pattern": args.regex}
    if getattr(args, "grammar", None):
        return {"type": "grammar", "ebnf": text_of(args.grammar, "--grammar")}
    if getattr(args, "json_object", False):
        return {"type": "json_object"}
    return None


def _policy(args):
    from ..core.constraints import ConstraintGrammar, parse_response_format
    from ..reference.processors import SamplingPolicy
    spec = parse_response_format(_response_format(args))
    return SamplingPolicy(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty,
                          grammar=ConstraintGrammar(spec) if spec is not None else None)


def _load(args, champion, draft):
    from ..reference.models import load_pair
    weights = args.weights or ("q8" if os.path.exists(os.path.join(champion, "model.q8.safetensors")) else "f32")
    return load_pair(champion, draft, champion_weights=weights)   # a folder as published runs its own weights


def _prompt_ids(pair, args, champion: str):
    if args.chat:   # message text without special-token parsing: see exactspec.formats.chat
        from ..formats.chat import encode_chat_prompt
        try:
            return encode_chat_prompt(pair.tokenizer, pair.tokenizer_config, [{"role": "user", "content": args.prompt}])
        except ExactSpecError as e:
            if e.code == E_BAD_ARGUMENT:
                raise
            raise ExactSpecError(e.code, f"{champion}: {e.message}") from None   # the model's template: name it
    return pair.tokenizer.encode(args.prompt, add_special_tokens=True, split_special_tokens=args.raw_text)


def _config(pair, args, seed):
    from ..core.orchestrator import GenerationConfig
    from ..core.policy import F32_LIMITS
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, policy=_policy(args), speculate=args.speculate,
                              k=args.k, scheduler=args.scheduler, seed=seed, stop_token_ids=pair.stop_token_ids,
                              stop_strings=tuple(args.stop))   # --stop is repeatable: a list of whole strings
    config.check_limits(F32_LIMITS)   # the browser's bounds: what one backend refuses, both refuse
    return config


def derive_seed(seed: int, index: int) -> int:
    """Seed of sample `index`: Threefry of (seed, 'SAMP', index), 64 bits."""
    from ..core.rng import threefry2x32
    x0, x1 = threefry2x32((seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF), (0x53414D50, index))
    return x0 | (x1 << 32)


def _models(args):
    """(champion, draft or None), a folder or a GGUF file each. speculate auto or draft takes --draft,
    else the shipped draft for a folder champion, or for a GGUF champion the draft that
    web/models/manifest.json binds to its sha256; auto without one runs lookup or none, draft
    without one is refused. Auto uses the draft only where it measures that it pays (the one real
    model's draft does not in the browser: docs/smollm2_draft.md)."""
    from ..formats.manifest import is_gguf_file
    from ..reference.models import default_models_dir, known_draft
    base = default_models_dir()
    champion = args.champion or os.path.join(base, "champion")
    if is_gguf_file(champion) and args.weights:
        raise ExactSpecError(E_BAD_ARGUMENT, "--weights: a GGUF champion runs the file's own weights")
    if args.speculate is None:
        args.speculate = "auto"
    if args.speculate in ("auto", "draft"):
        draft = args.draft or (known_draft(champion, base) if is_gguf_file(champion) else os.path.join(base, "draft"))
        if draft is None and args.speculate == "draft":
            raise ExactSpecError(E_BAD_ARGUMENT, f"--speculate draft: no draft is known for {champion} (the "
                                 f"'drafts' of {os.path.join(base, 'manifest.json')} name none for its sha256); "
                                 "give --draft")
        return champion, draft
    return champion, None


def _browser_payload(args, seed: int) -> dict:
    return {"prompt": args.prompt, "chat": args.chat, "raw_text": args.raw_text, "config": {
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_k": args.top_k,
        "top_p": args.top_p, "repetition_penalty": args.repetition_penalty, "speculate": args.speculate,
        "k": args.k, "scheduler": args.scheduler, "seed": seed, "stop_strings": list(args.stop),
        "response_format": _response_format(args)}}


def _run(args, seeds, stream=None) -> list:
    """Run one request per seed on the chosen backend; returns result dicts (same shape for both)."""
    if args.backend == "browser":
        if args.weights == "f32":
            raise ExactSpecError(E_BAD_ARGUMENT, "--weights f32: the browser backend runs the q8 champion only")
        from .browser_run import BrowserRuntime
        from ..core.constraints import parse_response_format
        parse_response_format(_response_format(args))     # refused here, before a browser starts
        champion, draft = _models(args)
        # the draft in the background, as the page and createEngine load it: auto's first answer does not
        # wait for a draft it could not amortise; speculate "draft" waits for it (docs/browser.md)
        with BrowserRuntime(champion, draft, champion_backend=args.champion_backend, threads=args.threads,
                            draft_in_background=True) as rt:
            outs = []
            for seed in seeds:
                out = rt.generate(_browser_payload(args, seed))
                result = dict(out["result"])
                result["timing_ms"] = {**result.get("timing_ms", {}), "load": rt.ready["timing_ms"],
                                       }
                outs.append(result)
            return outs
    champion, draft = _models(args)
    pair = _load(args, champion, draft)
    ids = _prompt_ids(pair, args, champion)
    results = []
    for seed in seeds:
        cancel = stream.cancel if stream else None
        results.append(pair.orchestrator.generate(ids, _config(pair, args, seed), on_event=stream,
                                                  cancel=cancel).to_dict())
        if stream and stream.broken:
            raise stream.broken
    return results


class _TokenPrinter:
    """on_event callback printing token text as it arrives. A stdout that fails (closed pipe)
    cancels the request rather than raising inside the orchestrator; _run then raises E_IO."""

    def __init__(self):
        from ..core.orchestrator import CancelToken
        self.cancel = CancelToken()
        self.broken = None   # ExactSpecError(E_IO) once stdout failed

    def __call__(self, env):
        if env["kind"] != "tokens" or self.broken:
            return
        try:
            sys.stdout.write(env["payload"]["text"])
            sys.stdout.flush()
        except OSError as exc:
            self.broken = _stdout_failed(exc)
            self.cancel.cancel()


def cmd_generate(args) -> int:
    stream = None if args.json else _TokenPrinter()
    result = _run(args, [args.seed], stream)[0]
    if args.json:
        print(json.dumps(result))
    else:
        if args.backend == "browser":
            sys.stdout.write(result["text"])
        st = result["stats"]
        print()
        forced = f", {st['forced']} forced" if st.get("structured") else ""
        print(f"[{result['finish_reason']}] {len(result['token_ids'])} tokens, {st['rounds']} rounds, "
              f"{st['accepted']}/{st['proposed']} accepted{forced}, {result['timing_ms']['total']:.0f} ms", file=sys.stderr)
    if result["error"]:
        _say_error(result["error"]["code"], result["error"]["message"])
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


def cmd_convert(args) -> int:
    from ..reference.convert import convert

    live, shown = sys.stderr.isatty(), [0]

    def progress(done, total, done_bytes, total_bytes):   # a terminal: one line rewritten in place
        if not live and done < total and done_bytes < shown[0] + total_bytes / 10:
            return                                        # else a line per tenth of the bytes
        shown[0] = done_bytes
        print(("\r" if live else "") + f"exactspec convert: {done}/{total} tensors, "
              f"{done_bytes / 1e6:.1f}/{total_bytes / 1e6:.1f} MB",
              end="\n" if done == total or not live else "", file=sys.stderr, flush=True)
    entry = convert(args.src, args.dst, progress=progress, role=args.role, q8_embedding=args.q8_embedding)
    artifact = entry["model"]["run_artifact"]
    if args.json:
        print(json.dumps(entry))
    else:
        print(f"{os.path.join(args.dst, artifact['file'])}: {artifact['bytes']} bytes, sha256 {artifact['sha256']}, "
              f"{entry['seconds']:.1f} s")
    return 0


def _say_error(code: str, message: str) -> None:
    """The one line every failure ends in (nothing if stderr itself is gone)."""
    if sys.stderr is None:
        return
    try:
        print(f"exactspec: {code}: {' '.join(message_without_code(code, message).split())}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _mute_stdout() -> None:
    """Point fd 1 at /dev/null so the interpreter's final flush of a dead pipe is silent
    (no "Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _stdout_failed(exc: OSError) -> ExactSpecError:
    _mute_stdout()
    what = "broken pipe" if isinstance(exc, BrokenPipeError) else (exc.strerror or type(exc).__name__)
    return ExactSpecError(E_IO, f"cannot write to stdout ({what}); output is incomplete")


def _dispatch(args) -> int:
    if sys.stdout is None:   # started with stdout closed (`>&-`): nowhere to put the output
        raise ExactSpecError(E_IO, "stdout is closed; redirect it to a file or /dev/null instead")
    if args.command in ("generate", "sample") and args.temperature is None:
        args.temperature = 0.0 if args.command == "generate" and args.chat else 1.0
    if args.command == "demo":
        from .demo import run_demo
        return run_demo(toy=args.toy, as_json=args.json, weights=args.weights, reference=args.reference,
                        toy_pair=args.toy_pair)
    if args.command == "convert":
        return cmd_convert(args)
    if args.command == "serve":
        from .server import serve_forever
        try:
            serve_forever("127.0.0.1", args.port, allow_origins=args.allow_origin)
        except KeyboardInterrupt:   # Ctrl-C is how a server is stopped: a normal exit 0, at any moment
            pass
        return 0
    if args.command == "bench":
        from ..evaluation.bench import cmd_bench
        return cmd_bench(args)
    return {"generate": cmd_generate, "sample": cmd_sample}[args.command](args)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: the command's cleanup runs, then one coded line."""


@contextlib.contextmanager
def _sigterm_as_interrupt():
    def raise_terminated(signum, frame):
        raise _Terminated()
    try:
        previous = signal.signal(signal.SIGTERM, raise_terminated)
    except ValueError:   # not the main thread (main() called from a test's thread): leave it be
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv=None) -> int:
    try:
        with _sigterm_as_interrupt():
            rc = _dispatch(build_parser().parse_args(argv))
        sys.stdout.flush()   # a pipe closed by the reader fails here, not at interpreter exit
        return rc
    except ExactSpecError as err:
        _say_error(err.code, err.message)
        return EXIT_USAGE if err.code == E_BAD_ARGUMENT else EXIT_ERROR
    except _Terminated:
        _say_error(E_CANCELLED, "terminated (SIGTERM)")
        return EXIT_TERMINATED
    except KeyboardInterrupt:
        _say_error(E_CANCELLED, "interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError as exc:   # stdout (the only pipe the CLI writes) closed by its reader
        err = _stdout_failed(exc)
        _say_error(err.code, err.message)
        return EXIT_ERROR
    except OSError as exc:   # a file, pipe or socket failure no layer below turned into a code
        _say_error(E_IO, f"{type(exc).__name__}: {exc.strerror or exc}")
        return EXIT_ERROR
    except Exception as exc:  # a bug: still one line; EXACTSPEC_DEBUG=1 shows the traceback
        if os.environ.get("EXACTSPEC_DEBUG"):
            raise
        _say_error(E_INTERNAL, f"{type(exc).__name__}: {exc}")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
