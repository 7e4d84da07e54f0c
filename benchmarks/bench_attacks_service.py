"""Issue 14's attacks on the environment service, replayed on loopback with bounded counts and times.

Two servers, both with 2 workers and an open-file limit of 1024 (the machine of the issue scaled
down: 20,000 idle connections against its limit become 2,000 against 1,024):

* before: the app under ``uvicorn.run(app, host, port, log_level="warning")``, what ``seal serve``
  ran before issue 14 (no header timeout, no connection limit, no log limit);
* now: ``seal serve`` (``SEAL_MAX_CONNECTIONS=640`` so they and the default backlog of 256 fit the 1,024 files; every
  other setting at its default).

Attacks (the "before" server gets the two that its uvicorn configuration decides):

1. idle connections: 2,000 sockets opened and left silent for header_timeout + 1.5 s while
   ``/health`` is asked every 0.5 s (2 s timeout);
2. log flood: 2,000 malformed requests, one after the other;
3. lone surrogates: 100 episodes whose tool argument holds ``\\ud83d`` (and U+2028, U+0085, NUL)
   through create, step, evaluate with the record; the same with ASCII text is the baseline;
4. repeated step after evaluate: 100 episodes, step 0, evaluate, step 0 again;
5. kill during respawn: each worker killed, then its replacement killed while it starts.

Usage: python benchmarks/bench_attacks_service.py
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from rich.table import Table

from harness import provenance_console

SERVER_FILES = 1024
IDLE_CONNECTIONS = 2000
MALFORMED_REQUESTS = 2000
EPISODES = 100
WORKERS = 2
TOOL_CALL = '<tool_call>{"name": "cd", "arguments": {"folder": %s}}</tool_call>'


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (SERVER_FILES, SERVER_FILES))


def _plain_uvicorn(port: int) -> None:
    """The server as ``seal serve`` ran it before issue 14."""
    import uvicorn

    from seal_rl.service.app import create_app
    from seal_rl.service.settings import ServiceSettings

    uvicorn.run(create_app(ServiceSettings(port=port, workers=WORKERS)), host="127.0.0.1", port=port, log_level="warning")


class Service:
    """One server process on a free loopback port, its stderr (the log) in a file."""

    def __init__(self, kind: str, log_dir: Path) -> None:
        with socket.create_server(("127.0.0.1", 0)) as probe:
            self.port = probe.getsockname()[1]
        self.url, self.kind = f"http://127.0.0.1:{self.port}", kind
        self.log = log_dir / f"{kind}.log"
        command = ([sys.executable, __file__, "--plain-uvicorn", str(self.port)] if kind == "before" else
                   [sys.executable, "-m", "seal_rl", "serve", "--port", str(self.port), "--workers", str(WORKERS)])  # fmt: skip
        env = {**os.environ, "SEAL_MAX_CONNECTIONS": "640"}
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(command, stderr=log, stdout=log, env=env, preexec_fn=_limit_files)
        self.ps = psutil.Process(self.process.pid)
        deadline = time.monotonic() + 120
        while not self._healthy():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the {kind} service did not start; see {self.log}:\n{self.log.read_text()[-2000:]}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            return httpx.get(self.url + "/health", timeout=2).json()["workers_alive"] == WORKERS
        except (httpx.HTTPError, ValueError):
            return False

    def log_bytes(self) -> int:
        return self.log.stat().st_size

    def usage(self) -> tuple[int, float]:
        """(open files of the server process, RSS MiB of it and its workers)"""
        try:
            tree = [self.ps, *self.ps.children(recursive=True)]
            return self.ps.num_fds(), sum(p.memory_info().rss for p in tree) / 2**20
        except psutil.Error:
            return 0, 0.0

    def workers(self) -> set[int]:
        pids = set()
        for child in self.ps.children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "seal_rl.service.workers" in " ".join(child.cmdline()):
                    pids.add(child.pid)
            except psutil.Error:  # ended meanwhile
                pass
        return pids

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _post(http: httpx.Client, path: str, body: dict) -> httpx.Response:
    return http.post(path, content=json.dumps(body).encode("ascii"), headers={"content-type": "application/json"})


def _strict(response: httpx.Response):
    def refuse(constant):
        raise ValueError(constant)

    return json.loads(response.content.decode("utf-8"), parse_constant=refuse)


# -- the attacks ----------------------------------------------------------------------------------


def idle_connections(service: Service, hold: float) -> dict:
    address = ("127.0.0.1", service.port)
    log_before, sockets = service.log_bytes(), []
    for _ in range(IDLE_CONNECTIONS):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(address)  # completes in the kernel's backlog even if the server never accepts
        sockets.append(sock)
    checks, peak_files, peak_mib = [], 0, 0.0
    started = time.monotonic()
    while time.monotonic() - started < hold:
        began = time.perf_counter()
        try:
            ok = httpx.get(service.url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            ok = False
        checks.append((ok, time.perf_counter() - began))
        files, mib = service.usage()
        peak_files, peak_mib = max(peak_files, files), max(peak_mib, mib)
        time.sleep(max(0.0, 0.5 - (time.perf_counter() - began)))
    closed = 0
    for sock in sockets:
        try:
            closed += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        sock.close()
    latencies = sorted(seconds for _, seconds in checks)
    return {"health_ok": sum(ok for ok, _ in checks), "health_checks": len(checks),
            "health_p50_ms": statistics.median(latencies) * 1e3, "health_max_ms": latencies[-1] * 1e3,
            "peak_files": peak_files, "peak_mib": peak_mib, "closed_by_server": closed,
            "log_bytes": service.log_bytes() - log_before}  # fmt: skip


def log_flood(service: Service) -> dict:
    log_before, answered = service.log_bytes(), 0
    started = time.perf_counter()
    for _ in range(MALFORMED_REQUESTS):
        with socket.create_connection(("127.0.0.1", service.port), timeout=5) as sock:
            sock.sendall(b"NONSENSE\x00 / HTTP/1.1\r\n\r\n")
            try:
                answered += sock.recv(64).startswith(b"HTTP/1.1 400")
            except OSError:
                pass
    seconds = time.perf_counter() - started
    time.sleep(0.5)  # let the server write what it will
    written = service.log.read_bytes()[log_before:]
    return {"answered_400": answered, "seconds": seconds, "log_bytes": len(written), "log_lines": written.count(b"\n")}


def surrogates(service: Service, argument: str) -> dict:
    errors, kept = 0, 0
    started = time.perf_counter()
    with httpx.Client(base_url=service.url, timeout=30) as http:
        for i in range(EPISODES):
            try:
                episode = _strict(_post(http, "/episodes", {"task_id": f"multi_turn_base_{i % 50}"}))["episode_id"]
                step = _post(http, f"/episodes/{episode}/step", {"message": TOOL_CALL % json.dumps(argument), "step": 0})
                evaluation = _post(http, f"/episodes/{episode}/evaluate", {"include_record": True})
                if step.status_code != 200 or evaluation.status_code != 200:
                    errors += 1
                    continue
                _strict(step)
                trace = _strict(evaluation)["record"]["trace"]
                kept += bool(trace) and trace[0]["arguments"] == {"folder": argument}
                http.delete(f"/episodes/{episode}")
            except (httpx.HTTPError, ValueError, KeyError):
                errors += 1
    return {"errors": errors, "kept": kept, "ms_per_episode": (time.perf_counter() - started) / EPISODES * 1e3}


def repeated_step(service: Service) -> dict:
    consistent, stale = 0, 0
    with httpx.Client(base_url=service.url, timeout=30) as http:
        for i in range(EPISODES):
            episode = _post(http, "/episodes", {"task_id": f"multi_turn_base_{i % 50}"}).json()["episode_id"]
            message = {"message": TOOL_CALL % '"."', "step": 0}
            _post(http, f"/episodes/{episode}/step", message)
            _post(http, f"/episodes/{episode}/evaluate", {})
            again = _post(http, f"/episodes/{episode}/step", message)
            consistent += again.status_code == 409 or (again.status_code == 200 and again.json()["done"])
            stale += again.status_code == 200 and not again.json()["done"]
            http.delete(f"/episodes/{episode}")
    return {"consistent": consistent, "stale": stale}


def kill_during_respawn(service: Service) -> dict:
    """Kill every worker and then each replacement as soon as it appears (still importing)."""
    seen: list[tuple[float, int, str, int]] = []  # (time, health status code, status, workers_alive)
    creates: list[tuple[float, int]] = []
    stop = threading.Event()

    def watch() -> None:
        with httpx.Client(base_url=service.url, timeout=5) as http:
            while not stop.is_set():
                try:
                    health = http.get("/health")
                    body = health.json()
                    seen.append((time.monotonic(), health.status_code, body["status"], body["workers_alive"]))
                    created = _post(http, "/episodes", {"task_id": "multi_turn_base_0"})
                    creates.append((time.monotonic(), created.status_code))
                    if created.status_code == 201:
                        http.delete(f"/episodes/{created.json()['episode_id']}")
                except (httpx.HTTPError, ValueError):
                    seen.append((time.monotonic(), 0, "no answer", -1))
                time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    known = service.workers()
    for victim in sorted(known):
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not (fresh := service.workers() - known) and time.monotonic() < deadline:
            time.sleep(0.002)
        for pid in fresh:
            os.kill(pid, signal.SIGKILL)
            known.add(pid)
    last_kill = time.monotonic()
    deadline = last_kill + 60
    while time.monotonic() < deadline and not (seen and seen[-1][2] == "ok" and seen[-1][0] > last_kill
                                               and creates and creates[-1][1] == 201):  # fmt: skip
        time.sleep(0.05)
    stop.set()
    watcher.join(10)
    healed = next((t for t, code, status, _ in seen if t > last_kill and status == "ok"), None)
    first_create = next((t for t, code in creates if t > last_kill and code == 201), None)
    return {
        "healed_s": None if healed is None else healed - last_kill,
        "create_s": None if first_create is None else first_create - last_kill,
        "statuses": sorted({f"{status} {code}" for _, code, status, _ in seen}),
        "lying_health": sum(status == "ok" and alive < WORKERS for _, _, status, alive in seen),
        "creates_503": sum(code == 503 for _, code in creates),
        "health_checks": len(seen),
        "final": httpx.get(service.url + "/health").json(),
    }


# -- the table ------------------------------------------------------------------------------------


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE_CONNECTIONS + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE_CONNECTIONS + 256), hard))
    from seal_rl.service.settings import ServiceSettings

    defaults = ServiceSettings()
    hold = defaults.header_timeout + 1.5
    started = time.perf_counter()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as log_dir:
        for kind in ("before", "now"):
            service = Service(kind, Path(log_dir))
            try:
                results[f"idle {kind}"] = idle_connections(service, hold)
                time.sleep(1.0)
                results[f"flood {kind}"] = log_flood(service)
                if kind == "now":
                    results["surrogates"] = surrogates(service, "\ud83d half an emoji, \u2028 \x85 \x00 \udc00")
                    results["ascii"] = surrogates(service, "plain ascii text of about the same length!")
                    results["repeat"] = repeated_step(service)
                    results["kill"] = kill_during_respawn(service)
            finally:
                service.stop()
    total = time.perf_counter() - started

    table = Table("attack", "server", "what happens", "figure", "vs before / baseline",
                  title=f"Attacks on the service, loopback, {WORKERS} workers, server limited to {SERVER_FILES} open files "
                        f"({os.cpu_count()} cores, {total:.0f} s in all)")  # fmt: skip
    for kind in ("before", "now"):
        idle = results[f"idle {kind}"]
        table.add_row(
            f"{IDLE_CONNECTIONS} idle connections, {hold:g} s", kind,
            f"/health answered {idle['health_ok']}/{idle['health_checks']}; server closed {idle['closed_by_server']} idle sockets",
            f"health p50 {idle['health_p50_ms']:.0f} ms, max {idle['health_max_ms']:.0f} ms; peak {idle['peak_files']} open files, "
            f"{idle['peak_mib']:.0f} MiB; log +{idle['log_bytes']:,} B",
            "" if kind == "before" else f"open files {idle['peak_files'] / max(1, results['idle before']['peak_files']):.2f}x",
        )  # fmt: skip
    for kind in ("before", "now"):
        flood = results[f"flood {kind}"]
        table.add_row(
            f"{MALFORMED_REQUESTS} malformed requests", kind, f"{flood['answered_400']} answered 400",
            f"log +{flood['log_bytes']:,} B in {flood['log_lines']} lines ({flood['seconds']:.1f} s)",
            "" if kind == "before" else f"log bytes {flood['log_bytes'] / max(1, results['flood before']['log_bytes']):.3f}x",
        )  # fmt: skip
    sur, ascii_ = results["surrogates"], results["ascii"]
    table.add_row(f"lone surrogates in a tool argument, {EPISODES} episodes", "now",
                  f"{EPISODES - sur['errors']}/{EPISODES} create+step+evaluate answered 200 with strict JSON; "
                  f"argument kept exactly in {sur['kept']}", f"{sur['ms_per_episode']:.1f} ms/episode",
                  f"{sur['ms_per_episode'] / ascii_['ms_per_episode']:.2f}x ASCII ({ascii_['ms_per_episode']:.1f} ms, "
                  f"{ascii_['errors']} errors)")  # fmt: skip
    repeat = results["repeat"]
    table.add_row(f"step repeated after evaluate, {EPISODES} episodes", "now",
                  f"{repeat['consistent']}/{EPISODES} answered 409 (ended); {repeat['stale']} stale done:false", "", "")
    kill = results["kill"]
    table.add_row(
        "every worker killed, then its replacement while starting", "now",
        f"health said {', '.join(kill['statuses'])}; {kill['lying_health']} 'ok' with workers missing; "
        f"{kill['creates_503']} creates answered 503 meanwhile",
        f"healed in {kill['healed_s']:.1f} s, first create {kill['create_s']:.1f} s after the last kill"
        if kill["healed_s"] is not None else "never healed",
        f"{kill['final']['worker_start_failures']} failed starts retried",
    )  # fmt: skip
    console = provenance_console(width=220)
    console.print(table)
    problems = []
    if results["idle now"]["health_ok"] < results["idle now"]["health_checks"] - 1:
        problems.append("health checks failed under idle connections")
    if sur["errors"] or sur["kept"] != EPISODES or repeat["stale"] or kill["healed_s"] is None or kill["lying_health"]:
        problems.append("an attack still works")
    if problems:
        raise SystemExit("; ".join(problems))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--plain-uvicorn":
        _plain_uvicorn(int(sys.argv[2]))
    else:
        main()
