"""Stale streams: a stream from which nothing has arrived for `periods` sample periods (the
setting TWINWATCH_STALE_PERIODS, 10 by default: as many as restart a stream's warm-up), and for
at least `min_s` seconds (TWINWATCH_STALE_MIN_S, 30 by default: gateways upload fast streams in
batches every few seconds), gets a `stale` alarm, raised by a timer (a silent sensor sends no
reading that could raise it) and closed by its next reading. Prometheus sees it too:
`twinwatch_stream_stale` and `twinwatch_seconds_since_reading`.

Silence is measured on the server's clock, from when the stream's last readings were accepted
(a restart counts as an arrival: nothing is known of the time the service was down). The alarm's
times are on the readings' clock, as every alarm's: it opens at the last reading's time plus the
limit, and closes at the next reading's, or at its own opening if that reading is older (the
readings were late, not missing: on their own clock there was no silence). A stream that never
sent a reading is not stale.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from app.metrics import Metrics
from app.monitoring.alarms import AlarmEvent
from app.storage.db import UNAVAILABLE
from app.storage.repositories import alarms as alarm_repo
from app.storage.repositories import readings as reading_repo
from app.streams.held import LiveStream
from app.streams.live import LiveStreams

log = logging.getLogger(__name__)

STALE = "stale"
CHECK_EVERY_S = 1.0


def stale_limit_s(live: LiveStream, periods: float, min_s: float) -> float | None:
    """Seconds of silence that make the stream stale; None while it has no known period."""
    period = live.sample_period_s
    if not math.isfinite(period) or period <= 0:
        return None
    return max(periods * period, min_s)


class StaleWatch:
    """The timer: a daemon thread that opens `stale` alarms (ingest closes them)."""

    def __init__(
        self,
        streams: LiveStreams,
        metrics: Metrics,
        *,
        periods: float,
        min_s: float = 0.0,
        delay: Callable[[str], float] | None = None,
    ) -> None:
        self.streams = streams
        self.metrics = metrics
        self.periods = periods
        self.min_s = min_s
        # Seconds a stream's readings may have been waiting to be processed (a bus worker's
        # backlog): its limit is that much longer, so the worker's delay is not taken for
        # the sensor's silence, and a sensor silent since before it still is.
        self.delay = delay
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="twinwatch-stale", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            try:
                self.check()
            except UNAVAILABLE as exc:  # told once per outage (a check may not touch the database)
                self.streams.database.outage.failed("the stale check", exc)
            except Exception:
                log.exception("checking for stale streams failed")

    def check(self, now: float | None = None) -> list[str]:
        """Open a stale alarm on every stream silent past its limit; returns their ids."""
        moment = time.monotonic() if now is None else now
        opened = []
        for live in self.streams.live_streams():
            limit = stale_limit_s(live, self.periods, self.min_s)
            if limit is None or live.stale_since is not None or not live.state.samples:
                continue  # (a stream that never sent anything is not silent: it has not begun)
            if moment - live.last_arrival > self._allowed(live, limit) and self._open(
                live, moment, limit
            ):
                opened.append(live.stream_id)
        return opened

    def declare(self, matching: Callable[[str], bool]) -> list[str]:
        """Open a stale alarm now on each stream `matching` picks, whatever its silence: its
        sender said it is gone (a Sparkplug death). The alarm's time is the last reading's."""
        moment = time.monotonic()
        return [
            live.stream_id
            for live in self.streams.live_streams()
            if matching(live.stream_id)
            and live.stale_since is None
            and live.state.samples
            and self._open(live, moment, 0.0, gone=True)
        ]

    def _allowed(self, live: LiveStream, limit: float) -> float:
        return limit + (0.0 if self.delay is None else self.delay(live.stream_id))

    def _open(self, live: LiveStream, moment: float, limit: float, *, gone: bool = False) -> bool:
        with self.streams.database.session() as session:
            owns = self.streams.owns  # (on the bus; before the stream is held, as a commit)
            if owns is not None and not owns(session, live.stream_id):
                return False
            held = self.streams.hold(session, [live.stream_id])[0]
            if held is not live or live.stale_since is not None:
                return False  # it moved meanwhile
            if not gone and moment - live.last_arrival <= self._allowed(live, limit):
                return False
            silence = moment - live.last_arrival
            sample = live.state.samples
            applied = alarm_repo.apply(
                session,
                stream_id=live.stream_id,
                opened=[AlarmEvent(STALE, sample, None, silence, limit)],
                closed=[],
                peaks={},
                # On the readings' clock, as every alarm time: its last reading, plus the limit.
                time_of=lambda _: reading_repo.datetime_at(
                    (live.state.last_time or 0) + round(limit * 1e6)
                ),
                model_name=live.model_name,
                model_version=live.model_version,
            )

            def committed() -> None:
                live.stale_since = sample
                self.metrics.publish_stale(
                    live.stream_id,
                    stale=True,
                    opened=len(applied.new),
                    incidents_opened=applied.incidents_opened,
                )

            self.streams.on_end(session, commit=committed)
        if gone:
            log.warning("stream %s is stale: its sender is gone", live.stream_id)
        else:
            log.warning("stream %s is stale: nothing for %.0f s", live.stream_id, silence)
        return True
