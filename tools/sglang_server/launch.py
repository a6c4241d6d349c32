"""Run ../shared/oracle/server/server_oracle.py's main() with one thing restored.

    $SGLANG_SERVER_VENV/bin/python launch.py SERVER_DIR -- [server_oracle.py args]

Runs in the server venv. The harness's ``fake_worker`` replaces
``Scheduler.init_model_worker``, and with it the real method's last step,
``set_random_seed(self.random_seed)`` (managers/scheduler.py, init_model_worker),
where ``random_seed`` is ``ServerArgs.random_seed``. Without it Python's ``random``
is never seeded, and the ``random`` schedule policy (``SchedulePolicy._sort_randomly``:
``random.shuffle(waiting_queue)``) differs from run to run. This wraps the fake
init so that it ends with SGLang's own ``set_random_seed(server_args.random_seed)``,
as a real server's does; nothing else changes. zygote.py imports this too.
"""
import os
import sys


def prepare(server_dir):
    """Import the harness from ``server_dir`` (its cpu_shims first, as it does)."""
    if server_dir not in sys.path:
        sys.path.insert(0, server_dir)
    import server_oracle  # noqa: F401  (imports cpu_shims before any sglang import)
    return server_oracle


def _patch_seed():
    import fake_worker
    if getattr(fake_worker.install, "_seeded", False):
        return
    orig_install = fake_worker.install

    def install(S, device_tokens, max_running):
        orig_install(S, device_tokens, max_running)
        fake_init = S.Scheduler.init_model_worker
        from sglang.srt.utils.common import set_random_seed

        def init_model_worker(self):
            fake_init(self)
            seed = getattr(self.server_args, "random_seed", None)
            if seed is not None:
                set_random_seed(int(seed))

        S.Scheduler.init_model_worker = init_model_worker

    install._seeded = True
    fake_worker.install = install


def run(server_dir, argv):
    so = prepare(server_dir)
    _patch_seed()
    return so.main(argv)


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) < 2 or args[1] != "--":
        print("usage: launch.py SERVER_DIR -- [server_oracle.py args]", file=sys.stderr)
        os._exit(2)
    rc = run(args[0], args[2:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # as server_oracle.py: the Scheduler leaves non-daemon threads behind
