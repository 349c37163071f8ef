"""eSpeak NG through the C library that the ``espeakng-loader`` wheel ships (ctypes).

The wheel carries libespeak-ng and its voice data, so no system package is needed.
eSpeak NG keeps global state: the same call sequence gives identical audio in a fresh
process, but repeated calls in one process may not. Callers that need determinism (the
corpus synthesizer) therefore give each unit of work a fresh process and a fixed order.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import espeakng_loader

from speechperf.errors import SpeechperfError

AUDIO_OUTPUT_SYNCHRONOUS = 2
POS_CHARACTER = 1
CHARS_UTF8 = 1
PARAM_RATE, PARAM_VOLUME, PARAM_PITCH, PARAM_RANGE = 1, 2, 3, 4
# Voices that load (checked on eSpeak NG 1.52); "en" is British English, "en-gb" fails.
ENGLISH_VOICES = ("en", "en-us", "en-gb-scotland", "en-gb-x-rp", "en-gb-x-gbclan", "en-gb-x-gbcwmd",
                  "en-029", "en-us-nyc")

_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int, ctypes.c_void_p)


class ESpeakError(SpeechperfError):
    """The eSpeak NG library could not be loaded or rejected a voice or text."""


@dataclass(frozen=True)
class Voice:
    """One synthetic speaker: an eSpeak voice, a variant and prosody settings."""

    voice: str  # eSpeak voice name, e.g. "en-us"
    variant: str  # variant file name in voices/!v, e.g. "f3" ("" for none)
    rate: int  # words per minute (eSpeak default 175)
    pitch: int  # base pitch 0..100 (default 50)
    pitch_range: int = 50  # intonation range 0..100

    @property
    def name(self) -> str:
        return f"{self.voice}+{self.variant}" if self.variant else self.voice


def _data_dir() -> Path:
    return Path(espeakng_loader.get_data_path())


def available_variants() -> list[str]:
    """Variant names shipped with the wheel (eSpeak ignores unknown ones silently)."""
    return sorted(p.name for p in (_data_dir() / "voices" / "!v").iterdir() if p.is_file())


class ESpeak:
    """A per-process eSpeak NG engine in synchronous mode; ``synth`` returns int16 audio."""

    _instance: "ESpeak | None" = None

    def __init__(self):
        try:
            self.lib = ctypes.CDLL(espeakng_loader.get_library_path())
        except OSError as e:
            raise ESpeakError(f"cannot load libespeak-ng from espeakng-loader: {e}") from e
        self.lib.espeak_Initialize.restype = ctypes.c_int
        self.lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        self.sample_rate = self.lib.espeak_Initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, str(_data_dir()).encode(), 0)
        if self.sample_rate <= 0:
            raise ESpeakError(f"espeak_Initialize failed ({self.sample_rate}) with data at {_data_dir()}")
        self._chunks: list[np.ndarray] = []
        self._cb = _CALLBACK(self._collect)  # keep a reference: the C side holds the pointer
        self.lib.espeak_SetSynthCallback(self._cb)
        self.lib.espeak_SetVoiceByName.argtypes = [ctypes.c_char_p]
        self.lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                          ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
        self._variants = set(available_variants())

    @classmethod
    def get(cls) -> "ESpeak":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def _collect(self, wav, n, events) -> int:
        if n > 0 and wav:
            self._chunks.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
        return 0  # 0: continue synthesis

    def set_voice(self, v: Voice) -> None:
        if v.variant and v.variant not in self._variants:
            raise ESpeakError(f"unknown eSpeak variant {v.variant!r}")
        if self.lib.espeak_SetVoiceByName(v.name.encode()) != 0:
            raise ESpeakError(f"eSpeak NG rejected voice {v.name!r}")
        for param, value in ((PARAM_RATE, v.rate), (PARAM_PITCH, v.pitch), (PARAM_RANGE, v.pitch_range)):
            self.lib.espeak_SetParameter(param, int(value), 0)

    def synth(self, text: str) -> np.ndarray:
        """Speak ``text`` with the current voice; int16 samples at ``self.sample_rate``."""
        self._chunks = []
        data = text.encode("utf-8") + b"\0"
        err = self.lib.espeak_Synth(data, len(data), 0, POS_CHARACTER, 0, CHARS_UTF8, None, None)
        if err != 0:
            raise ESpeakError(f"espeak_Synth failed ({err}) for text {text[:40]!r}")
        self.lib.espeak_Synchronize()
        if not self._chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(self._chunks).astype(np.int16)
