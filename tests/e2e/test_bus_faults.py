"""The bus through the faults it must ride out, with real processes: `twinwatch serve` on the
bus, a `twinwatch worker`, a test's own `nats-server` and PostgreSQL (the worker reaches it
through a proxy the test cuts, as a restart or a network partition looks to it).

- PostgreSQL away: the worker stops acknowledging, the batches wait on the bus, a POST answers
  503 (safe to re-send); when it is back every batch is committed once.
- NATS restarted: a POST answers 503 meanwhile; afterwards every process carries on without a
  restart, and nothing is lost or doubled.
- A worker stopped (SIGSTOP) past its lease: another takes its partitions; when it wakes it
  writes nothing for them (the fence), and nothing is lost or doubled."""

from __future__ import annotations

import asyncio
import signal
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy.engine import make_url

from app.storage.db import Database
from app.storage.repositories import readings as reading_repo
from tests.e2e.conftest import ServerFactory, new_database
from tests.support.bus import PARTITIONS, WorkerProcess, until_held, worker_env
from tests.support.models import epoch_times, lab_readings
from tests.support.nats import NatsServer, nats_server
from tests.support.proxy import TcpProxy

STREAMS = ["pump-1", "pump-2", "pump-3", "pump-4"]
BATCH = 50


class Client:
    """Posts each stream's batches in order; a batch answered 503 is sent again (as the answer
    says is safe) until it is answered 200."""

    def __init__(self, base_url: str) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=60)
        self.sent = dict.fromkeys(STREAMS, 0)
        self.unavailable = 0

    def round(self, limit_s: float = 120) -> None:
        for stream in STREAMS:
            first = self.sent[stream]
            deadline = time.monotonic() + limit_s
            while True:
                answer = self.http.post(
                    f"/v1/streams/{stream}/readings?results=false",
                    json=lab_readings(first, first + BATCH),
                )
                if answer.status_code == 200:
                    break
                assert answer.status_code == 503, answer.text
                assert answer.headers["retry-after"] and "again" in answer.json()["detail"]
                self.unavailable += 1
                assert time.monotonic() < deadline, answer.text
                time.sleep(0.3)
            self.sent[stream] += BATCH


def stored_exactly(database_url: str, sent: dict[str, int]) -> None:
    database = Database(database_url)
    try:
        with database.session() as session:
            for stream, count in sent.items():
                times = reading_repo.all_times(session, stream_id=stream)
                expected = np.array([round(t * 1e6) for t in epoch_times(0, count)])
                assert np.array_equal(times, expected), stream
    finally:
        database.dispose()


def through(proxy: TcpProxy, database_url: str) -> str:
    url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)


def test_postgresql_and_nats_away_and_back(
    make_server: ServerFactory, databases: ExitStack, tmp_path: Path, calibrated_models: Path
) -> None:
    database_url = new_database(databases, "postgresql", tmp_path)
    target = make_url(database_url)
    with ExitStack() as stack:
        nats: NatsServer = stack.enter_context(nats_server(tmp_path))
        proxy = TcpProxy((target.host or "127.0.0.1", target.port or 5432))
        stack.callback(proxy.close)
        env = worker_env(database_url, nats.url, calibrated_models, tmp_path / "worker-data")
        api = make_server("api", database_url)
        api.env |= {key: env[key] for key in env if key.startswith("TWINWATCH_BUS_")}
        api.env["TWINWATCH_BUS_WAIT_S"] = "2"
        api.start()
        worker = WorkerProcess(
            "worker", env | {"TWINWATCH_DATABASE_URL": through(proxy, database_url)}, tmp_path
        )
        stack.callback(lambda: worker.end(signal.SIGKILL))
        asyncio.run(until_held(nats.url, lambda held: len(held) == PARTITIONS, 90))
        client = Client(api.base_url)
        for stream in STREAMS:
            assert client.http.put(f"/v1/streams/{stream}", json={}).status_code == 201
        client.round()

        # PostgreSQL away from the worker: batches wait on the bus, POSTs answer 503.
        proxy.cut()
        waiting = client.http.post(
            f"/v1/streams/{STREAMS[0]}/readings?results=false",
            json=lab_readings(client.sent[STREAMS[0]], client.sent[STREAMS[0]] + BATCH),
        )
        assert waiting.status_code == 503
        time.sleep(3)
        proxy.restore()
        client.round()  # the batch that waited is committed; its re-send answered as one

        # NATS restarted: 503 meanwhile, then everything carries on.
        nats.stop()
        down = client.http.post(
            f"/v1/streams/{STREAMS[1]}/readings?results=false",
            json=lab_readings(client.sent[STREAMS[1]], client.sent[STREAMS[1]] + BATCH),
        )
        assert down.status_code == 503
        nats.start()
        client.round()
        client.round()
        assert worker.process.poll() is None and api.process is not None
        assert api.process.poll() is None
    stored_exactly(database_url, client.sent)
    api.stop()


def test_a_worker_paused_past_its_lease_writes_nothing_after_it(
    make_server: ServerFactory, databases: ExitStack, tmp_path: Path, calibrated_models: Path
) -> None:
    database_url = new_database(databases, "postgresql", tmp_path)
    with ExitStack() as stack:
        nats: NatsServer = stack.enter_context(nats_server(tmp_path))
        env = worker_env(database_url, nats.url, calibrated_models, tmp_path / "worker-data")
        api = make_server("api", database_url)
        api.env |= {key: env[key] for key in env if key.startswith("TWINWATCH_BUS_")}
        api.start()
        paused = WorkerProcess("paused", env, tmp_path)
        stack.callback(lambda: paused.end(signal.SIGKILL))
        other = WorkerProcess("other", env, tmp_path)
        stack.callback(lambda: other.end(signal.SIGKILL))
        asyncio.run(
            until_held(nats.url, lambda held: set(held.values()) == {"paused", "other"}, 90)
        )
        client = Client(api.base_url)
        for stream in STREAMS:
            assert client.http.put(f"/v1/streams/{stream}", json={}).status_code == 201
        client.round()

        # Paused while readings come: the other worker takes its partitions when its leases
        # expire, and the readings waiting for them are committed there.
        paused.process.send_signal(signal.SIGSTOP)
        for _ in range(3):
            client.round()
        took = asyncio.run(until_held(nats.url, lambda held: set(held.values()) == {"other"}, 30))
        assert took < 10
        client.round()
        # It wakes: its leases are gone; what it had in hand is not written.
        paused.process.send_signal(signal.SIGCONT)
        time.sleep(3)
        for _ in range(2):
            client.round()
        assert paused.process.poll() is None  # it carries on, with its share again
        asyncio.run(
            until_held(nats.url, lambda held: set(held.values()) == {"paused", "other"}, 30)
        )
        client.round()
    stored_exactly(database_url, client.sent)
    log = (tmp_path / "paused.log").read_text()
    assert "lost [" in log
    api.stop()
