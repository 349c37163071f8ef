"""CTC decoders behind one interface, in a registry filled by a decorator.

A decoder maps log-probabilities ``(T, C)`` to text (``decode``) or a batch ``(T, B, C)``
with lengths to a list of texts (``decode_batch``). Registered: ``greedy``, ``beam``
(prefix beam search), ``wordbeam`` (word beam search with dictionary and bigram LM) and,
when flashlight-text is installed, ``flashlight`` (its lexicon decoder with KenLM).
"""
from __future__ import annotations

from pathlib import Path
import numpy as np

from speechperf.errors import SpeechperfError
from speechperf.registry import Registry

DECODERS = Registry("decoder", [f"speechperf.decode.{m}" for m in ("greedy", "beam", "wordbeam", "flashlight")])
# Scheidl's four word beam search modes (here, not in wordbeam.py, so configs and the CLI can
# name them without importing numba)
WORDBEAM_MODES = ("words", "ngrams", "ngrams_forecast", "ngrams_forecast_sample")


class DecodeError(SpeechperfError, ValueError):
    """Log-probabilities of the wrong shape or kind, or a bad decoder setting."""


def register_decoder(name: str):
    """Decorator: register a factory ``f(beam=..., features=..., lm=..., **kw) -> decoder``."""
    return DECODERS.register(name)


def check_log_probs(log_probs: np.ndarray, classes: int = 30) -> None:
    """Raise DecodeError unless ``log_probs`` is a finite-or--inf float (T, classes) array."""
    if not isinstance(log_probs, np.ndarray) or log_probs.ndim != 2 or log_probs.shape[1] != classes:
        shape = getattr(log_probs, "shape", type(log_probs).__name__)
        raise DecodeError(f"expected (T, {classes}) log-probabilities, got {shape}")
    if log_probs.dtype.kind != "f":
        raise DecodeError(f"expected float log-probabilities, got dtype {log_probs.dtype}")
    if np.isnan(log_probs).any() or (log_probs > 1e-3).any():
        raise DecodeError("log-probabilities hold NaN or values > 0 (give log_softmax output, not logits)")


def get_decoder(name: str, beam: int = 1, features: Path | None = None, lm=None, mode: str | None = None,
                units=None, **kw):
    """The decoder ``name`` with beam width ``beam`` (1 = greedy for every beam decoder).

    ``lm``: a BigramLM, an lm.json path or (flashlight) an ARPA path; otherwise the LM
    stored beside the prepared ``features`` folder is loaded (built first if missing).
    ``mode``: the word beam search mode (wordbeam only). ``units``: the model's output units
    (data/units.py's ``Units``; None: the 30 characters). The beam decoders search characters
    only: BPE units need ``greedy`` or beam width 1.
    """
    factory = DECODERS.lookup(name)
    if not isinstance(beam, (int, np.integer)) or beam < 1:
        raise DecodeError(f"beam width must be an integer >= 1, got {beam!r}")
    if units is not None and not units.is_char:
        if name != "greedy" and beam > 1:
            raise DecodeError(f"decoder {name!r} (beam {beam}) searches the 30 characters only, not the units "
                              f"{units.spec!r}: decode them with 'greedy' (or beam 1)")
        return DECODERS.lookup("greedy")(beam=1, units=units)
    if lm is not None:
        kw["lm"] = lm
    if mode is not None:
        kw["mode"] = mode
    return factory(beam=int(beam), features=features, **kw)
