"""What processes a stream: the recurrence of its trained model with its overrides, of what it
learned (with its revisions), or, while it learns, the learning recurrence. One recurrence per
model and overrides, shared by every stream configured alike."""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from app.errors import DataError
from app.learning.learn import LearnedModel
from app.monitoring.config import MonitorConfig
from app.registry import AUTO, ModelRegistry, RegisteredModel, learned_name
from app.storage.models import LearnedModel as LearnedModelRow
from app.storage.models import Stream
from app.storage.repositories import readings as reading_repo
from app.streams.learning import Learning, LearningPlan, learning_recurrence
from app.streams.overrides import monitor_config, with_overrides
from app.streams.recurrence import Recurrence

log = logging.getLogger(__name__)


class Kinds:
    """Each stream's `Kind`, from its row and its learned model's row."""

    def __init__(self, registry: ModelRegistry, max_gap: int) -> None:
        self.registry = registry
        self.max_gap = max_gap
        self._guard = threading.Lock()
        self._recurrences: dict[tuple[str, str, str], Recurrence] = {}

    def recurrence_for(self, model: RegisteredModel, overrides: dict[str, Any]) -> Recurrence:
        """One recurrence per model and detector overrides, shared by every stream configured
        alike. Raises a DataError or ArtifactError if the configuration cannot monitor."""
        key = (model.name, model.version, json.dumps(overrides, sort_keys=True))
        with self._guard:
            recurrence = self._recurrences.get(key)
        if recurrence is None:
            recurrence = Recurrence(
                model.forecaster, monitor_config(model, overrides), max_gap=self.max_gap
            )
            with self._guard:
                recurrence = self._recurrences.setdefault(key, recurrence)
        return recurrence

    def of(self, stream: Stream, row: LearnedModelRow | None) -> Kind:
        """What processes the stream: its named model, its learned one (`row`), or (still
        learning) the learning recurrence."""
        if stream.model_name != AUTO:
            pinned = None if stream.model_version is None else str(stream.model_version)
            model = self.registry.require(stream.model_name, pinned)
            period = stream.sample_period_s if stream.sample_period_s is not None else 0.1
            recurrence = self.recurrence_for(model, stream.detector_overrides)
            return Kind(recurrence, period, model.version)
        if row is None or row.model is None:
            learning = Learning(
                LearningPlan.of(stream.learning),
                first_time=None,
                error=None if row is None else row.error,
            )
            recurrence = learning_recurrence(len(stream.channels))
            return Kind(recurrence, math.inf, "learning", learning=learning)
        learned = LearnedModel.from_json(row.model)
        base = self.learned_recurrence(stream, learned)
        revisions = []
        for revision in row.revisions:
            revised = MonitorConfig.model_validate(revision["monitor"])
            recurrence = self.learned_recurrence(stream, replace(learned, monitor=revised))
            revisions.append((int(revision["from_sample"]), recurrence))
        if stream.model_version is not None:
            version = str(stream.model_version)
        else:  # (learned before the catalogue kept learned versions)
            version = f"learned-{row.fitted_at:%Y%m%dT%H%M%SZ}"
        return Kind(
            revisions[-1][1] if revisions else base,
            learned.sample_period_s,
            version,
            name=learned_name(stream.id),
            learned=learned,
            quiet_until=row.learned_from,
            base=base,
            revisions=revisions,
            relearn_at=None if row.relearn_at is None else reading_repo.micro(row.relearn_at),
            prove_at=None if row.prove_at is None else reading_repo.micro(row.prove_at),
        )

    def learned_recurrence(self, stream: Stream, learned: LearnedModel) -> Recurrence:
        """The recurrence of a model the stream learned, with the stream's detector overrides
        (if it did not get the detectors they leave on: without them, and a warning)."""
        try:
            monitor = with_overrides(learned.monitor, stream.detector_overrides)
        except DataError as exc:
            log.warning("stream %s: its overrides are not applied: %s", stream.id, exc.detail)
            monitor = learned.monitor
        return Recurrence(learned.forecaster, monitor, max_gap=self.max_gap)


@dataclass
class Kind:
    """What processes a stream (`Kinds.of`)."""

    recurrence: Recurrence  # the one its next readings go through
    sample_period_s: float
    version: str
    name: str | None = None  # what its alarms name the model (by default the stream's model)
    learning: Learning | None = None
    learned: LearnedModel | None = None
    quiet_until: int | None = None  # a learned stream's learning readings: no alarm before
    base: Recurrence | None = None  # a revised stream's recurrence before its first revision
    revisions: list[tuple[int, Recurrence]] = field(default_factory=list)
    relearn_at: int | None = None
    prove_at: int | None = None
