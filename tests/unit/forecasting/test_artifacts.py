from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.errors import ArtifactError
from app.forecasting.artifacts import (
    EXPORT_GRAPH_COMMAND,
    FORMAT_VERSION,
    GRAPH_FILE,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    build_forecaster,
    export_graph,
    load_model,
    save_model,
    update_manifest,
)
from app.forecasting.base import Forecaster
from app.forecasting.baselines import Naive, SeasonalNaive
from app.forecasting.linear_ar import LinearAR
from app.forecasting.lstm import GlobalLSTMForecaster, LSTMForecaster
from app.forecasting.stateful_lstm import StatefulLSTMForecaster
from app.forecasting.training import TrainingConfig
from app.forecasting.windows import sliding_windows

TINY = TrainingConfig(epochs=2, batch_size=32, validation=50)


def wave(samples: int = 600) -> np.ndarray:
    rng = np.random.default_rng(0)
    t = np.arange(samples)
    return np.stack([np.sin(t / 2) + 1e-3 * t, rng.normal(size=samples)], axis=1)


@pytest.fixture(scope="module")
def lstm() -> LSTMForecaster:
    model = LSTMForecaster(window=16, hidden=8, n_channels=2, training=TINY)
    return model.fit(wave(), train_end=500)


@pytest.fixture
def saved(lstm: LSTMForecaster, tmp_path: Path) -> Path:
    return save_model(lstm, tmp_path / "model", extra={"channels": ["value", "load"]})


def windows() -> np.ndarray:
    return sliding_windows(wave(), np.arange(500, 600), 16)


def edit_manifest(directory: Path, change: dict[str, Any]) -> None:
    path = directory / MANIFEST_FILE
    manifest = json.loads(path.read_text())
    manifest.update(change)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    "make",
    [
        lambda: LSTMForecaster(window=16, hidden=8, n_channels=2, training=TINY),
        lambda: GlobalLSTMForecaster(window=16, hidden=8, n_channels=2, training=TINY),
        lambda: StatefulLSTMForecaster(
            window=16, hidden=8, n_channels=2, sequence=16, training=TINY
        ),
        lambda: LinearAR(window=16, horizon=3, n_channels=2),
        lambda: Naive(window=16, n_channels=2),
        lambda: SeasonalNaive(period=10, window=16, n_channels=2),
    ],
)
def test_round_trip_gives_bitwise_the_same_forecasts(make: Any, tmp_path: Path) -> None:
    model: Forecaster = make().fit(wave(), train_end=500)
    save_model(model, tmp_path / "m", extra={"channels": ["value", "load"]})
    loaded = load_model(tmp_path / "m")
    assert type(loaded.forecaster) is type(model)
    assert loaded.forecaster.config() == model.config()
    np.testing.assert_array_equal(loaded.forecaster.predict(windows()), model.predict(windows()))
    assert loaded.manifest["kind"] == model.kind
    assert loaded.manifest["channels"] == ["value", "load"]


def test_the_manifest_says_what_the_model_is(saved: Path, lstm: LSTMForecaster) -> None:
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    assert manifest["format_version"] == FORMAT_VERSION
    assert (manifest["kind"], manifest["window"], manifest["horizon"]) == ("lstm", 16, 1)
    assert manifest["config"]["hidden"] == 8
    assert manifest["config"]["training"]["epochs"] == 2
    assert manifest["parameter_count"] == lstm.n_parameters
    assert manifest["training"]["mean"] == lstm.mean_.tolist()
    assert manifest["training"]["history"]["epochs_run"] == 2
    assert manifest["created_at"].endswith("+00:00")
    assert len(manifest["weights_sha256"]) == 64
    assert manifest["graph_sha256"] == hashlib.sha256((saved / GRAPH_FILE).read_bytes()).hexdigest()


def test_loading_leaves_the_global_random_state_alone(saved: Path) -> None:
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_model(saved)
    np.testing.assert_array_equal(torch.rand(3), expected)


def test_update_manifest_adds_fields_and_keeps_the_model_loadable(saved: Path) -> None:
    update_manifest(saved, thresholds={"point": 0.52})
    loaded = load_model(saved)
    assert loaded.manifest["thresholds"] == {"point": 0.52}
    assert loaded.manifest["kind"] == "lstm"
    with pytest.raises(ArtifactError, match="cannot change kind"):
        update_manifest(saved, kind="linear-ar")
    with pytest.raises(ArtifactError, match="without NaN"):
        update_manifest(saved, thresholds={"point": float("nan")})
    assert load_model(saved).manifest["thresholds"] == {"point": 0.52}


def test_missing_pieces_are_named(saved: Path, tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="no model directory"):
        load_model(tmp_path / "nowhere")
    (saved / WEIGHTS_FILE).unlink()
    with pytest.raises(ArtifactError, match=f"missing {WEIGHTS_FILE}"):
        load_model(saved)
    (saved / MANIFEST_FILE).unlink()
    with pytest.raises(ArtifactError, match=f"missing {MANIFEST_FILE}"):
        load_model(saved)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "transformer"}, "unknown model kind 'transformer'"),
        ({"format_version": FORMAT_VERSION + 1}, "newer twinwatch"),
        ({"format_version": "1"}, "positive integer"),
        ({"channels": ["value"]}, "1 channel name"),
        ({"window": 32}, "window 32 but config says 16"),
    ],
)
def test_an_inconsistent_manifest_is_refused(
    saved: Path, change: dict[str, Any], message: str
) -> None:
    edit_manifest(saved, change)
    with pytest.raises(ArtifactError, match=message):
        load_model(saved)


def test_invalid_json_is_refused(saved: Path) -> None:
    (saved / MANIFEST_FILE).write_text('{"kind": "lstm",')
    with pytest.raises(ArtifactError, match="not valid JSON"):
        load_model(saved)


def test_tampered_weights_are_refused(saved: Path) -> None:
    weights = bytearray((saved / WEIGHTS_FILE).read_bytes())
    weights[-5] ^= 0x01
    (saved / WEIGHTS_FILE).write_bytes(bytes(weights))
    with pytest.raises(ArtifactError, match="sha256 does not match"):
        load_model(saved)


def test_truncated_weights_are_refused_even_with_a_matching_hash(saved: Path) -> None:
    cut = (saved / WEIGHTS_FILE).read_bytes()[:-100]
    (saved / WEIGHTS_FILE).write_bytes(cut)
    with pytest.raises(ArtifactError, match="truncated or modified"):
        load_model(saved)
    edit_manifest(saved, {"weights_sha256": hashlib.sha256(cut).hexdigest()})
    with pytest.raises(ArtifactError, match="not a readable safetensors file"):
        load_model(saved)


def test_a_pickle_is_never_unpickled(saved: Path) -> None:
    torch.save({"payload": torch.zeros(3)}, saved / WEIGHTS_FILE)  # a pickle in disguise
    data = (saved / WEIGHTS_FILE).read_bytes()
    edit_manifest(saved, {"weights_sha256": hashlib.sha256(data).hexdigest()})
    with pytest.raises(ArtifactError, match="not a readable safetensors file"):
        load_model(saved)


def test_weights_that_do_not_fit_the_config_are_refused(saved: Path) -> None:
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    edit_manifest(saved, {"config": {**manifest["config"], "hidden": 16}})
    with pytest.raises(ArtifactError, match=r"tensor 'module\.lstm\.weight_ih_l0' is \(32, 2\)"):
        load_model(saved)


def test_weights_of_another_kind_are_refused(saved: Path, tmp_path: Path) -> None:
    linear = LinearAR(window=16, n_channels=2).fit(wave(), train_end=500)
    other = save_model(linear, tmp_path / "linear")
    (saved / WEIGHTS_FILE).write_bytes((other / WEIGHTS_FILE).read_bytes())
    edit_manifest(
        saved, {"weights_sha256": json.loads((other / MANIFEST_FILE).read_text())["weights_sha256"]}
    )
    with pytest.raises(ArtifactError, match="do not fit a lstm model"):
        load_model(saved)


def test_saving_refuses_unfitted_models_and_bad_directories(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match="not been fitted"):
        save_model(LSTMForecaster(window=16), tmp_path / "a")
    with pytest.raises(ArtifactError, match="not been fitted"):
        save_model(LinearAR(window=16), tmp_path / "b")
    (tmp_path / "file").write_text("x")
    linear = LinearAR(window=16).fit(wave()[:, 0], train_end=500)
    with pytest.raises(ArtifactError, match="not a directory"):
        save_model(linear, tmp_path / "file")
    with pytest.raises(ArtifactError, match="2 channel name"):
        save_model(linear, tmp_path / "c", extra={"channels": ["value", "load"]})
    with pytest.raises(ArtifactError, match="may not override kind"):
        save_model(linear, tmp_path / "d", extra={"kind": "lstm"})


def test_build_forecaster_is_the_kind_registry() -> None:
    model = build_forecaster(GlobalLSTMForecaster(window=8).config())
    assert type(model) is GlobalLSTMForecaster
    with pytest.raises(ArtifactError, match="normalises 'per_window'"):
        build_forecaster({**LSTMForecaster(window=8).config(), "normalisation": "global"})
    assert (
        build_forecaster({"kind": "naive", "window": 4, "horizon": 2, "n_channels": 1}).horizon == 2
    )
    with pytest.raises(ArtifactError, match="unknown model kind"):
        build_forecaster({"kind": "prophet"})
    with pytest.raises(ArtifactError, match="invalid linear-ar configuration"):
        build_forecaster({"kind": "linear-ar", "window": 0, "horizon": 1, "n_channels": 1})
    with pytest.raises(ArtifactError, match="invalid lstm configuration"):
        build_forecaster({"kind": "lstm", "window": 8})


def test_a_tampered_graph_is_refused(saved: Path) -> None:
    graph = bytearray((saved / GRAPH_FILE).read_bytes())
    graph[len(graph) // 2] ^= 0x01
    (saved / GRAPH_FILE).write_bytes(bytes(graph))
    with pytest.raises(ArtifactError, match=f"{GRAPH_FILE}: sha256 does not match"):
        load_model(saved)


def test_a_graph_that_is_no_graph_is_refused_even_with_a_matching_hash(saved: Path) -> None:
    (saved / GRAPH_FILE).write_bytes(b"not onnx")
    edit_manifest(saved, {"graph_sha256": hashlib.sha256(b"not onnx").hexdigest()})
    with pytest.raises(ArtifactError, match="inference graph cannot be loaded"):
        load_model(saved)


def test_a_graph_of_the_other_lstm_is_refused(saved: Path, tmp_path: Path) -> None:
    stateful = StatefulLSTMForecaster(window=16, hidden=8, n_channels=2, training=TINY)
    other = save_model(stateful.fit(wave(), train_end=500), tmp_path / "stateful")
    graph = (other / GRAPH_FILE).read_bytes()
    (saved / GRAPH_FILE).write_bytes(graph)
    edit_manifest(saved, {"graph_sha256": hashlib.sha256(graph).hexdigest()})
    with pytest.raises(ArtifactError, match=r"reads \['x', 'h0', 'c0'\]"):
        load_model(saved)


def test_a_missing_graph_names_the_command_that_rebuilds_it(saved: Path) -> None:
    (saved / GRAPH_FILE).unlink()
    with pytest.raises(ArtifactError, match=f"missing {GRAPH_FILE}.*{EXPORT_GRAPH_COMMAND}"):
        load_model(saved)


def test_an_artifact_from_before_graphs_is_refused_until_its_graph_is_exported(
    saved: Path, lstm: LSTMForecaster
) -> None:
    """Format 1 wrote no graph: loading says which command adds it, which then exports the
    same network from the stored weights."""
    manifest = json.loads((saved / MANIFEST_FILE).read_text())
    del manifest["graph_sha256"]
    (saved / MANIFEST_FILE).write_text(json.dumps({**manifest, "format_version": 1}))
    (saved / GRAPH_FILE).unlink()
    weights = (saved / WEIGHTS_FILE).read_bytes()
    with pytest.raises(ArtifactError, match=f"earlier twinwatch.*`{EXPORT_GRAPH_COMMAND} {saved}`"):
        load_model(saved)
    loaded = export_graph(saved)
    assert loaded.manifest["format_version"] == FORMAT_VERSION
    assert (saved / WEIGHTS_FILE).read_bytes() == weights
    np.testing.assert_array_equal(loaded.forecaster.predict(windows()), lstm.predict(windows()))
    assert load_model(saved).manifest["graph_sha256"] == loaded.manifest["graph_sha256"]


def test_export_graph_refuses_a_model_without_a_network(tmp_path: Path) -> None:
    linear = save_model(LinearAR(window=16).fit(wave()[:, 0], train_end=500), tmp_path / "ar")
    with pytest.raises(ArtifactError, match="forecasts without a graph"):
        export_graph(linear)


def imports_torch(script: str) -> bool:
    """Whether `script`, run in a new interpreter, ends with torch imported."""
    check = script + "\nimport sys\nprint('torch' in sys.modules)\n"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip() == "True"


def test_loading_and_forecasting_import_no_torch(saved: Path) -> None:
    """What serving does with a model (the CLI imported, the artifact loaded, a forecast made)
    never imports torch: the plain install has none."""
    assert not imports_torch(
        "import numpy as np\n"
        "import app.cli\n"
        "from app.forecasting.artifacts import load_model\n"
        f"model = load_model({str(saved)!r}).forecaster\n"
        "model.predict(np.zeros((3, model.window, model.n_channels)))\n"
    )


def test_the_service_imports_no_torch() -> None:
    assert not imports_torch("import app.main")
