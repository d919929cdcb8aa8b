"""The test-only fault gate a model stub installs at start-up (rose_triton/faults.py): off unless
ROSE_TEST_FAULTS names a folder; then a point is held while its gate file exists there."""
from __future__ import annotations

import threading

import pytest

from engine_lib import faults
from rose_triton.faults import FAULTS_ENV, FileGate, entered_file, gate_file, install_fault_gate
from testing.waiting import wait_until


@pytest.fixture(autouse=True)
def no_hook_after():
    yield
    faults.install(None)


def test_off_by_default_no_point_is_held_and_nothing_is_looked_at(tmp_path):
    install_fault_gate({})
    gate_file(tmp_path, faults.ENCODER_BATCH).touch()
    assert faults.hook is None and not faults.held(faults.ENCODER_BATCH)
    faults.wait(faults.TOKENIZE)  # returns at once
    install_fault_gate({FAULTS_ENV: ""})  # an empty value is unset
    assert faults.hook is None


def test_the_environment_installs_a_file_gate_on_its_folder(tmp_path):
    install_fault_gate({FAULTS_ENV: str(tmp_path)})
    assert isinstance(faults.hook, FileGate)
    assert not faults.held(faults.ENCODER_BATCH)
    gate_file(tmp_path, faults.ENCODER_BATCH).touch()
    assert faults.held(faults.ENCODER_BATCH) and not faults.held(faults.TOKENIZE)


def test_a_gate_folder_that_is_not_there_fails_at_start_up(tmp_path):
    with pytest.raises(ValueError, match=f"{FAULTS_ENV}=.*is not a folder"):
        install_fault_gate({FAULTS_ENV: str(tmp_path / "missing")})
    assert faults.hook is None


def test_waiting_callers_each_say_they_entered_and_leave_on_release(tmp_path):
    gate = FileGate(str(tmp_path))
    gate.wait(faults.TOKENIZE)  # not held: no wait, no entered file
    assert not entered_file(tmp_path, faults.TOKENIZE).exists()
    gate_file(tmp_path, faults.TOKENIZE).touch()
    worker = threading.Thread(target=gate.wait, args=(faults.TOKENIZE,), daemon=True)
    worker.start()
    wait_until(entered_file(tmp_path, faults.TOKENIZE).exists, 30, "the caller to enter the hold")
    assert worker.is_alive()
    second = threading.Thread(target=gate.wait, args=(faults.TOKENIZE,), daemon=True)
    second.start()
    wait_until(lambda: entered_file(tmp_path, faults.TOKENIZE).stat().st_size == 2, 30, "a second caller")
    gate_file(tmp_path, faults.TOKENIZE).unlink()
    for waiting in (worker, second):
        waiting.join(10)
        assert not waiting.is_alive()
