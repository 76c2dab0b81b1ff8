"""The serving process: ``python -m asyncgraph.serve --part-config G.json --model DIR
[--servers ip_config]``.

Binds the HTTP port first (liveness), then loads the model, connects to the servers (or holds
the partitions itself without ``--servers``), runs one warm-up batch and only then answers
ready (and writes ``--ready-file``). SIGTERM/SIGINT: readiness turns 503, the listener closes,
queued and running requests finish (within ``--drain-timeout``), the client closes, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path

import torch
from aiohttp import web

from asyncgraph.client.async_client import AsyncClient
from asyncgraph.client.ipconfig import IpConfig
from asyncgraph.env import ENV_SECRET_FILE
from asyncgraph.errors import AsyncGraphError, InvalidRequestError
from asyncgraph.serve.artifact import load_model
from asyncgraph.serve.batching import BatchOptions, DynamicBatcher
from asyncgraph.serve.core import InferenceCore
from asyncgraph.serve.http import ServeState, build_app
from asyncgraph.serve.wire import WireServer

__all__ = ["build_parser", "main"]

log = logging.getLogger("asyncgraph.serve")


def _fanouts(text: str) -> list[int]:
    try:
        return [int(f) for f in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fanouts: comma-separated integers, got {text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m asyncgraph.serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--part-config", type=Path, help="the partitioning's <graph>.json (standalone: required)")
    p.add_argument("--model", type=Path, required=True, help="model folder (model.json + model.pt)")
    p.add_argument("--servers", type=Path, help="ip_config of the running servers (else standalone)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (see --ready-file)")
    p.add_argument(
        "--msgpack-port", type=int, help="also serve the msgpack protocol (InferenceClient tcp://)"
    )
    p.add_argument("--reuse-port", action="store_true", help="SO_REUSEPORT: several processes, one port")
    p.add_argument("--max-batch", type=int, default=256, help="most distinct nodes per batch")
    p.add_argument(
        "--max-delay-ms",
        type=float,
        default=2.0,
        help="longest a request waits for company while another batch runs",
    )
    p.add_argument(
        "--idle-delay-ms", type=float, default=0.0, help="the same while no other batch runs (default: none)"
    )
    p.add_argument(
        "--inline-rows",
        type=int,
        default=None,
        help="run the forward of batches with at most this many input rows on the event loop "
        "(default: 8192 on CPU, 0 on a GPU)",
    )
    p.add_argument("--torch-threads", type=int, default=1, help="intra-op threads of the forward pass")
    p.add_argument("--queue-limit", type=int, default=4096, help="queued nodes beyond which 429")
    p.add_argument(
        "--batches-in-flight",
        type=int,
        help="batches run at once (default: 1 when every partition is read in this process and "
        "the model runs on CPU, else 2: one waits for servers or a device while another runs)",
    )
    p.add_argument("--deadline-ms", type=float, default=1000.0, help="a request's longest time")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--fanouts", type=_fanouts, help="override model.json's fanouts, e.g. 10,10 or -1,-1")
    p.add_argument(
        "--feature-cache-bytes",
        type=int,
        default=0,
        help="cache this many bytes of remote partitions' input rows (co-located ones are shared memory)",
    )
    p.add_argument("--seed", type=int, default=0, help="the sampling seed of every batch")
    p.add_argument("--connect-timeout", type=float, default=60.0)
    p.add_argument(
        "--reconnect-window",
        type=float,
        default=3600.0,
        help="seconds a lost server is reconnected (requests meanwhile end at their deadline); 0: never",
    )
    p.add_argument(
        "--no-shared-memory", action="store_true", help="read co-located partitions over sockets too"
    )
    p.add_argument("--drain-timeout", type=float, default=30.0)
    p.add_argument("--ready-file", type=Path, help="written (JSON: host, port, pid) once ready")
    return p


async def _open_client(args: argparse.Namespace) -> AsyncClient:
    if args.servers is None:
        if args.part_config is None:
            raise InvalidRequestError("give --part-config (standalone) or --servers (an ip_config)")
        return AsyncClient.standalone(args.part_config)
    graph_name = None
    if args.part_config is not None:
        from asyncgraph.partition import PartitionConfig

        graph_name = PartitionConfig.load(args.part_config).graph_name
    secret_file = os.environ.get(ENV_SECRET_FILE) or None
    secret = Path(secret_file).read_bytes().strip() if secret_file else None
    return await AsyncClient.connect(
        IpConfig.load(args.servers).addresses(),
        graph_name=graph_name,
        secret=secret,
        connect_timeout=args.connect_timeout,
        reconnect_window=args.reconnect_window,
        use_shared_memory=not args.no_shared_memory,
    )


def _write_ready(path: Path, host: str, port: int, msgpack_port: int | None) -> None:
    tmp = path.with_name(path.name + ".tmp")
    info = {"host": host, "port": port, "msgpack_port": msgpack_port, "pid": os.getpid()}
    tmp.write_text(json.dumps(info))
    os.replace(tmp, path)


async def serve(args: argparse.Namespace) -> int:
    if args.torch_threads > 0:  # small batches gain nothing from more; they compete with the servers
        torch.set_num_threads(args.torch_threads)
    spec, model = await asyncio.to_thread(load_model, args.model, args.device)
    state = ServeState(spec)
    runner = web.AppRunner(
        build_app(state, max_body_bytes=args.max_body_bytes),
        shutdown_timeout=args.drain_timeout,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_port=args.reuse_port or None)
    await site.start()
    server = getattr(site, "_server", None)
    sockets = getattr(server, "sockets", None) or []
    port = int(sockets[0].getsockname()[1]) if sockets else int(args.port)
    wire: WireServer | None = None
    msgpack_port = None
    if args.msgpack_port is not None:
        wire = WireServer(state, max_frame=args.max_body_bytes)
        msgpack_port = await wire.start(args.host, args.msgpack_port, reuse_port=args.reuse_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    aio: AsyncClient | None = None
    try:
        aio = await _open_client(args)
        core = InferenceCore(aio, model, args.fanouts or spec.fanouts, feat=spec.feat, device=args.device,
                             seed=args.seed, inline_rows=_inline_rows(args))  # fmt: skip
        await core.check_features()
        if args.feature_cache_bytes > 0:
            cached = await core.build_cache(args.feature_cache_bytes, batch_size=args.max_batch)
            log.info("feature cache: %s", cached)
        await core.warm_up()
        await asyncio.to_thread(_settle)
        options = BatchOptions(
            max_batch=args.max_batch,
            max_delay=args.max_delay_ms / 1e3,
            idle_delay=args.idle_delay_ms / 1e3,
            queue_limit=args.queue_limit,
            in_flight=_batches_in_flight(args, aio),
            deadline=args.deadline_ms / 1e3,
        )
        state.core, state.batcher = core, DynamicBatcher(core.infer, options, state.metrics)
        state.batcher.start()
        state.ready = True
        if args.ready_file is not None:
            _write_ready(args.ready_file, args.host, port, msgpack_port)
        log.info("serving %s on %s:%d", spec.name, args.host, port)
        await stop.wait()
        state.draining = True
        drained = asyncio.ensure_future(state.batcher.drain(args.drain_timeout))
        if wire is not None:
            await wire.close(args.drain_timeout)
        await runner.cleanup()  # the listener closes; running handlers finish
        await drained
        core.close()
        return 0
    finally:
        state.draining = True
        with contextlib.suppress(Exception):
            await runner.cleanup()
        if aio is not None:
            await aio.close()


def _inline_rows(args: argparse.Namespace) -> int:
    """``--inline-rows``, or its default: on CPU, small batches' forward runs on the loop. Handed
    to the forward thread, a 1 ms forward waited for the GIL behind the loop (and the loop
    behind it): at 1,000 single-node requests/s on PubMed, p99 21 ms inline against 44-59 ms
    handed off (benchmarks/README.md §23). A GPU forward waits for its device: off the loop."""
    if args.inline_rows is not None:
        return int(args.inline_rows)
    return 8192 if str(args.device).startswith("cpu") else 0


def _batches_in_flight(args: argparse.Namespace, aio: AsyncClient) -> int:
    """``--batches-in-flight``, or its default. Where every partition is read in this process
    (standalone or co-located through shared memory) and the forward runs on the loop, a batch
    never waits: two at once only share the one core and both finish later. At 1,000 requests/s
    on PubMed (three interleaved rounds): p99 13.5 / 21.2 / 13.0 ms with one against 29.8 / 18.4
    / 29.0 ms with two (benchmarks/README.md §23). With servers elsewhere or a device, a second
    batch runs while the first waits for them."""
    if args.batches_in_flight is not None:
        return int(args.batches_in_flight)
    everything_here = len(aio.local_partitions()) == aio.num_partitions
    return 1 if everything_here and str(args.device).startswith("cpu") else 2


def _settle() -> None:
    """Before readiness: the compiled kernels loaded (not compiling beside the first requests),
    and everything made so far moved out of the garbage collector's sight (``gc.freeze``), so a
    full collection walks the requests' objects, not the start-up's (torch, numba, the model):
    both showed as latency spikes of 100-300 ms in the first seconds and under load. The live
    graph's sampling kernels too (~45 ms from numba's cache): loaded at the first sample of a
    graph that became live, they held the first requests after its first update. And the
    neighbour sums of a CPU forward (``nn.sage``: until loaded, a CSR product ~0.25 ms slower)."""
    from asyncgraph import inference_kernel
    from asyncgraph.dataloading.relabel_kernel import wait_batch_kernels
    from asyncgraph.kernels import overlay_sample

    wait_batch_kernels(300.0)
    inference_kernel.wait_ready(300.0)
    overlay_sample.warm_up()  # a graph that becomes live while serving: its sampler is ready
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        try:
            import uvloop  # the graph servers' loop: a third of the loop's time was asyncio's own
        except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
            return asyncio.run(serve(args))
        return uvloop.run(serve(args))
    except AsyncGraphError as exc:
        print(f"asyncgraph.serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
