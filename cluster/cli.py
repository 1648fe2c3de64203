"""`autotuned-serve cluster`: N replicas of the daemon on a Ray cluster behind one OpenAI API.

Registered through the `autotuned_serve.commands` entry point (serving/cli.py), and imports Ray
only when run, so the command line works without the `cluster` extra installed.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading

MISSING_RAY = "ray is not installed: pip install -e '.[cluster]'"


def add_parser(sub) -> None:
    from cluster.cluster_spec import ClusterSpec
    from cluster.planner_config import PlannerConfig
    from cluster.router import RouterConfig
    from serving.setting_flags import add_setting_flag
    from serving.settings import default_of

    spec = lambda name: default_of(ClusterSpec, name)  # noqa: E731
    p = sub.add_parser("cluster", help="run N replicas on Ray Serve behind one OpenAI API, routed by load and "
                       "prefix affinity (docs/cluster.md; needs the `cluster` extra)")
    p.add_argument("--replicas", type=int, default=spec("replicas"), help="engine replicas (default %(default)s)")
    p.add_argument("--config", default=None, help="the daemon's YAML settings for every replica")
    add_setting_flag(p, "model", override=True)
    add_setting_flag(p, "host")          # the ingress's
    add_setting_flag(p, "port")
    p.add_argument("--address", default=None, help="a running Ray cluster (e.g. auto); default: start a local one")
    p.add_argument("--state-dir", default=spec("state_dir"),
                   help="replica NAME keeps its state in STATE_DIR/NAME (default %(default)s)")
    p.add_argument("--tuner-storage", default=None, help="Optuna storage all replicas share: journal:PATH "
                   "(file-locked) or an RDB URL (default: each replica its own SQLite)")
    p.add_argument("--router", default=default_of(RouterConfig, "policy"), choices=["affinity", "load", "round_robin"],
                   help="routing policy: affinity (prefix affinity within a load bound), load or round_robin "
                   "(default %(default)s)")
    p.add_argument("--replica-cpus", type=float, default=spec("replica_cpus"),
                   help="Ray CPUs per replica (default %(default)s)")
    p.add_argument("--replica-gpus", type=float, default=spec("replica_gpus"),
                   help="Ray GPUs per replica, 1 on a GPU cluster (default %(default)s)")
    p.add_argument("--torch-threads", type=int, default=None, help="torch threads per replica")
    p.add_argument("--max-replicas", type=int, default=None, help="run the SLO planner (docs/cluster.md): it "
                   "sizes the fleet between --min-replicas and this, starting at --replicas")
    p.add_argument("--min-replicas", type=int, default=default_of(PlannerConfig, "min_replicas"),
                   help="the planner's least replicas (default %(default)s)")
    p.add_argument("--replica-capacity-rps", type=float, default=None, help="the planner's capacity of one "
                   "replica within the SLO, requests/s (e.g. from `autotuned-serve capacity`)")
    p.add_argument("--plan-interval-s", type=float, default=default_of(PlannerConfig, "interval_s"),
                   help="the planner's interval in seconds (default %(default)s)")
    add_setting_flag(p, "tune", override=True)
    add_setting_flag(p, "calibrate", override=True)   # replicas sharing a machine would measure each other
    p.set_defaults(run_plugin=run)


def spec_from_args(args: argparse.Namespace):
    from cluster.cluster_spec import ClusterSpec
    from cluster.planner_config import PlannerConfig
    from cluster.router import RouterConfig

    flags = (("model", args.model), ("tune", args.tune), ("calibrate", args.calibrate))
    settings = {k: v for k, v in flags if v is not None}
    planner = None
    if getattr(args, "max_replicas", None) is not None:
        planner = PlannerConfig(min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                                interval_s=args.plan_interval_s, replica_capacity_rps=args.replica_capacity_rps)
    return ClusterSpec(replicas=args.replicas, config=args.config, settings=settings, state_dir=args.state_dir,
                       tuner_storage=args.tuner_storage, router=RouterConfig(policy=args.router),
                       replica_cpus=args.replica_cpus, replica_gpus=args.replica_gpus,
                       torch_threads=args.torch_threads, planner=planner)


def run(args: argparse.Namespace) -> None:
    try:
        import ray
        from ray import serve
    except ImportError:
        raise ValueError(MISSING_RAY) from None
    from cluster.app import cluster_app
    from serving.http_server import is_loopback

    spec = spec_from_args(args)
    if not is_loopback(args.host) and not spec.daemon_settings().api_config("").api_key:
        raise ValueError(f"binding {args.host} (not loopback) needs an API key for the replicas' /admin: set "
                         "api_key in the config or AUTOTUNED_SERVE_API_KEY")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ray.init(address=args.address, include_dashboard=False)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(cluster_app(spec), name="autotuned-serve", route_prefix="/",
                  external_scaler_enabled=spec.planner is not None)    # the planner scales through Serve
        print(f"serving {spec.replicas} replicas on http://{args.host}:{args.port} (Ctrl-C stops)", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()
