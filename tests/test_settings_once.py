"""The watch and observe settings are written once (issue 29, item 5): every signature that lists them is built
from, or held to, the one definition, so they cannot drift apart."""

from __future__ import annotations

import dataclasses
import inspect
import sys
import typing

import pytest
import torch

import advmon
from advmon.hooks import ARGUMENT_NAME_OPTIONS, ArgumentNames, Recorder
from advmon.observation import InputObservation, ObserveSettings, observe_call, observe_inputs

WATCHES = {"advmon.watch": advmon.watch, "Monitor.watch": advmon.Monitor.watch}


def _options() -> list[inspect.Parameter]:
    """ArgumentNames' fields as the keyword-only parameters a watch takes."""
    return [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in inspect.signature(ArgumentNames).parameters.values()]


def _keywords(signature: inspect.Signature) -> list[inspect.Parameter]:
    return [p for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]


@pytest.mark.parametrize("name", WATCHES)
def test_a_watch_takes_exactly_the_argument_names_with_their_defaults_and_types(name):
    keywords = _keywords(inspect.signature(WATCHES[name]))
    assert keywords == _options()
    assert [p.name for p in keywords] == list(ARGUMENT_NAME_OPTIONS)


def test_the_two_watches_have_one_signature():
    monitor = advmon.Monitor("settings-once", sinks=[])
    assert inspect.signature(advmon.watch) == inspect.signature(monitor.watch)
    assert str(inspect.signature(advmon.watch)).startswith("(fn: 'F | None' = None, *, rewards: 'str | None' = ")
    monitor.close()


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.get_overloads is Python 3.11's")
@pytest.mark.parametrize("name", WATCHES)
def test_the_typed_overloads_spell_the_same_keywords(name):
    """The ``@overload``s type checkers read are written out; they must say what ArgumentNames says."""
    overloads = typing.get_overloads(WATCHES[name])
    assert len(overloads) == 2
    bare, configured = (inspect.signature(o) for o in overloads)
    assert _keywords(bare) == []
    assert _keywords(configured) == _options()


@pytest.mark.parametrize("name", WATCHES)
def test_an_unknown_keyword_is_the_type_error_python_gives(name):
    qualname = "watch" if name == "advmon.watch" else "Monitor.watch"
    monitor = advmon.Monitor("settings-once-errors", sinks=[])
    watch = advmon.watch if name == "advmon.watch" else monitor.watch
    with pytest.raises(TypeError, match=rf"^{qualname}\(\) got an unexpected keyword argument 'reward'$"):
        watch(reward="scores")
    with pytest.raises(TypeError, match="positional argument"):
        watch(lambda: None, "scores")
    with pytest.raises(advmon.AdvmonConfigError, match="argument name for rewards"):
        watch(rewards="not an identifier")
    monitor.close()


def test_instrument_knows_the_same_options():
    class Estimator:
        def compute_advantage(self, rewards):
            return rewards

    with pytest.raises(advmon.AdvmonConfigError, match="unknown argument name option"):
        advmon.instrument(Estimator(), advmon.Monitor("settings-once-instrument", sinks=[]), reward="scores")


def test_observe_call_forwards_observe_inputs_keywords_and_no_list_of_its_own():
    """observe_call's own parameters are the output's; the inputs and the settings are observe_inputs'."""
    own = set(inspect.signature(observe_call).parameters)
    assert own == {"advantages", "taps", "problems", "inputs"}
    assert "settings" in inspect.signature(observe_inputs).parameters
    settings_fields = {f.name for f in dataclasses.fields(ObserveSettings)}
    assert not settings_fields & set(inspect.signature(observe_inputs).parameters)


def test_the_settings_travel_as_one_object():
    settings = ObserveSettings(reward_range=(0.0, 1.0), exemplars=2, bound_factor=3.0)
    seen = observe_inputs(estimator="e", rewards=torch.tensor([1.0, 0.0]), mask=None, groups=None, group_size=2,
                          problems=[], settings=settings)
    assert isinstance(seen, InputObservation) and seen.settings is settings
    work = seen.parts.host_work
    kept = work.settings
    assert (kept.reward_range, kept.exemplars, kept.bound_factor) == ((0.0, 1.0), 2, 3.0)


def test_a_monitor_gives_its_watched_calls_its_settings():
    monitor = advmon.Monitor("settings-once-monitor", sinks=[], reward_range=(0.0, 1.0), exemplars=3)
    call = monitor.start_call("e", {"rewards": torch.tensor([1.0, 0.0])}, None, ArgumentNames())
    assert (call.seen.settings.reward_range, call.seen.settings.exemplars) == ((0.0, 1.0), 3)
    monitor.close()


def test_the_monitor_implements_the_recorder_hooks_calls():
    """hooks declares what it calls (Recorder); Monitor has each of it, with the same parameters."""
    methods = {name: member for name, member in vars(Recorder).items() if not name.startswith("_") and callable(member)}
    assert set(methods) == {"start_call", "finish_call", "record_tap"}
    for name, member in methods.items():
        assert inspect.signature(getattr(advmon.Monitor, name)).parameters.keys() == \
            inspect.signature(member).parameters.keys(), name
    assert "run" in Recorder.__annotations__
    monitor = advmon.Monitor("settings-once-recorder", sinks=[])
    assert isinstance(monitor.run, str)
    monitor.close()
