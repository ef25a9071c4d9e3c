"""The counted, reversible patch behind patch_onnxruntime and patch_quark."""

import types

import pytest

from histocal.patching import CountedPatch, PatchUse


def _target() -> types.SimpleNamespace:
    return types.SimpleNamespace(f="original", g="original g")


def test_nested_uses_are_counted_and_the_last_undo_restores():
    t = _target()
    patch = CountedPatch(lambda: [(t, "f", "ours"), (t, "g", "ours g")])
    patch.apply()
    patch.apply()
    assert (t.f, t.g, patch.active) == ("ours", "ours g", True)
    patch.undo()
    assert (t.f, patch.active) == ("ours", True)
    patch.undo()
    assert (t.f, t.g, patch.active) == ("original", "original g", False)
    patch.undo()  # without a use: a no-op
    assert t.f == "original"


def test_a_failing_first_use_patches_nothing():
    def fail() -> list:
        raise ImportError("no such package")

    patch = CountedPatch(fail)
    with pytest.raises(ImportError, match="no such package"):
        patch.apply()
    assert not patch.active


def test_a_use_patches_on_construction_and_a_with_block_undoes_it():
    t = _target()

    class Use(PatchUse):
        PATCH = CountedPatch(lambda: [(t, "f", "ours")])

    Use()
    assert t.f == "ours"
    with Use() as use:
        assert isinstance(use, Use) and t.f == "ours"
    assert t.f == "ours"  # the first use still holds
    Use.PATCH.undo()
    assert t.f == "original"


def test_a_routed_function_bound_while_patched_follows_the_undo():
    t = types.SimpleNamespace(f=lambda: "original")
    original = t.f
    patch = CountedPatch(lambda: [(t, "f", patch.route(lambda: "ours", original))])
    patch.apply()
    bound = t.f  # a client's `from module import f` while patched
    assert bound() == "ours"
    patch.undo()
    assert t.f is original and bound() == "original"
    patch.apply()
    assert bound() == "ours"  # patched again: the old binding follows
    patch.undo()
