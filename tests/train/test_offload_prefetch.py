"""How far ahead offloaded activations come back (ghsweep/train/offload.py): any distance the knob
allows keeps backward's activations at or below what the end of forward held."""

from __future__ import annotations

from ghsweep.train.offload import prefetch_distance


def most_layers_held_in_backward(layers: int, offloaded: int, distance: int) -> int:
    """The most layers' activations on the GPU at once while backward runs layer j = L-1 .. 0: the
    kept layers not yet reached (N..j) and the offloaded ones fetched (at j <= i + d) but not yet used."""
    return max(
        max(0, j - offloaded + 1) + sum(1 for i in range(offloaded) if j <= i + distance and i <= j)
        for j in range(layers)
    )


def test_auto_fetches_as_early_as_the_peak_allows():
    for layers in range(3, 40):
        for offloaded in range(1, layers - 1):
            kept = layers - offloaded  # what the end of forward holds on the GPU
            auto = prefetch_distance(layers, offloaded, "auto")
            assert auto == layers - offloaded - 1
            assert most_layers_held_in_backward(layers, offloaded, auto) <= kept
            # One layer earlier would hold more than forward did.
            assert most_layers_held_in_backward(layers, offloaded, auto + 1) > kept


def test_a_set_distance_is_taken_up_to_the_earliest_and_never_below_one():
    assert prefetch_distance(32, 4, 4) == 4
    assert prefetch_distance(32, 4, 40) == 27
    assert prefetch_distance(32, 31, "auto") == 1 and prefetch_distance(32, 32, 3) == 1
