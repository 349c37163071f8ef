"""A seeded English sentence generator for the embedded corpus.

Sentences come from a small phrase-structure grammar (clauses of noun phrase + verb phrase
with tense, agreement, modals, negation with contractions, prepositional phrases,
subordinate clauses) over word lists shipped in ``words/``: ~550 nouns, ~260 verbs, ~200
adjectives and ~65 adverbs, inflected by rule (irregular forms listed), plus function
words. Within each list words are drawn with Zipf-Mandelbrot weights by rank, so a few
words are frequent and most are rare, as in real text; the dictionary and bigram LM of
the decoders then have real work to do. Everything depends only on the seed.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

WORDS_DIR = Path(__file__).with_name("words")
ZIPF_SHIFT = 2.7  # Mandelbrot's shift: flattens the head of the distribution
DETERMINERS = ("the", "the", "the", "a", "this", "that", "my", "your", "his", "her", "our", "their", "every", "some",
               "no")
PLURAL_DETERMINERS = ("the", "the", "these", "those", "my", "your", "our", "their", "some", "many", "few", "all the")
PRONOUNS = (("i", 1), ("you", 2), ("he", 3), ("she", 3), ("we", 2), ("they", 2), ("it", 3))
OBJECT_PRONOUNS = ("me", "you", "him", "her", "us", "them", "it")
PREPOSITIONS = ("in", "on", "at", "with", "from", "to", "for", "under", "over", "near", "behind", "across",
                "through", "into", "after", "before", "during", "without", "about", "around", "along", "beside")
SUBORDINATORS = ("when", "because", "while", "although", "if", "before", "after", "since", "until")
CONJUNCTIONS = ("and", "but", "so", "and then", "or")
MODALS = ("will", "can", "could", "should", "would", "might", "must")
CONTRACTED_NEGATIONS = {"will": "won't", "can": "can't", "could": "couldn't", "should": "shouldn't",
                        "would": "wouldn't", "must": "mustn't", "might": "might not"}
OPENERS = ("i think", "i'm sure", "it's true that", "they say", "you know", "let's say", "she's sure that",
           "we're told that", "he's afraid that", "i'll bet", "it seems that")


@dataclass(frozen=True)
class Lexicon:
    nouns: tuple[tuple[str, str], ...]  # (singular, plural)
    verbs: tuple[tuple[str, str, str, str, str], ...]  # (base, 3sg, past, participle, ing)
    adjectives: tuple[str, ...]
    adverbs: tuple[str, ...]


def _lines(name: str) -> list[list[str]]:
    seen, out = set(), []
    for line in (WORDS_DIR / name).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            fields = line.split(",")
            if fields[0] not in seen:
                seen.add(fields[0])
                out.append(fields)
    return out


def plural(noun: str) -> str:
    if noun.endswith(("s", "x", "z", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def third_person(verb: str) -> str:
    if verb in ("have", "be", "do", "go"):
        return {"have": "has", "be": "is", "do": "does", "go": "goes"}[verb]
    return plural(verb)


def regular_forms(verb: str) -> tuple[str, str]:
    """(past, ing) of a regular verb: drop a final e before -ing, y -> ied after a consonant."""
    if verb.endswith("e"):
        return verb + "d", (verb if verb.endswith("ee") else verb[:-1]) + "ing"
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ied", verb + "ing"
    return verb + "ed", verb + "ing"


@lru_cache(maxsize=1)
def lexicon() -> Lexicon:
    nouns = tuple((f[0], f[1] if len(f) > 1 else plural(f[0])) for f in _lines("nouns.txt"))
    verbs = []
    for f in _lines("verbs.txt"):
        if len(f) == 4:
            base, past, part, ing = f
        else:
            base = f[0]
            past, ing = regular_forms(base)
            part = past
        verbs.append((base, third_person(base), past, part, ing))
    return Lexicon(nouns, tuple(verbs), tuple(f[0] for f in _lines("adjectives.txt")),
                   tuple(f[0] for f in _lines("adverbs.txt")))


def vocabulary() -> set[str]:
    """Every word the generator can emit."""
    lex = lexicon()
    words = {w for pair in lex.nouns for w in pair} | {w for forms in lex.verbs for w in forms}
    words |= set(lex.adjectives) | set(lex.adverbs)
    for group in (DETERMINERS, PLURAL_DETERMINERS, OBJECT_PRONOUNS, PREPOSITIONS, SUBORDINATORS, CONJUNCTIONS,
                  MODALS, CONTRACTED_NEGATIONS.values(), OPENERS, [p for p, _ in PRONOUNS],
                  ["an", "not", "did", "didn't", "does", "doesn't", "don't", "was", "were", "wasn't", "weren't",
                   "is", "are", "am", "has", "have", "had", "isn't", "aren't", "hasn't", "haven't", "i'm"]):
        for phrase in group:
            words.update(phrase.split())
    return words


class SentenceGenerator:
    """Draws grammatical sentences of ``min_words``..``max_words`` words from a seeded RNG."""

    def __init__(self, seed: int, min_words: int = 3, max_words: int = 30):
        self.rng = random.Random(seed)
        self.lex = lexicon()
        self.min_words, self.max_words = min_words, max_words
        self._weights = {n: _zipf(len(getattr(self.lex, n))) for n in ("nouns", "verbs", "adjectives", "adverbs")}

    def _pick(self, kind: str):
        return self.rng.choices(getattr(self.lex, kind), weights=self._weights[kind])[0]

    def noun_phrase(self) -> tuple[str, int, bool]:
        """(text, person, is_plural): pronoun or determiner + adjectives + noun (+ PP)."""
        r = self.rng
        if r.random() < 0.3:
            word, person = r.choice(PRONOUNS)
            return word, person, word in ("we", "they", "you")
        many = r.random() < 0.3
        sing, plur = self._pick("nouns")
        words = [r.choice(PLURAL_DETERMINERS if many else DETERMINERS)]
        words += [self._pick("adjectives") for _ in range(r.choice((0, 0, 1, 1, 2)))]
        words.append(plur if many else sing)
        if words[0] == "a" and words[1][0] in "aeiou":
            words[0] = "an"
        if r.random() < 0.15:
            words += [r.choice(PREPOSITIONS), *self._object().split()]
        return " ".join(words), 3, many

    def _object(self) -> str:
        r = self.rng
        if r.random() < 0.15:
            return r.choice(OBJECT_PRONOUNS)
        sing, plur = self._pick("nouns")
        many = r.random() < 0.3
        adj = [self._pick("adjectives")] if r.random() < 0.4 else []
        det = r.choice(PLURAL_DETERMINERS if many else DETERMINERS)
        if det == "a" and (adj or [sing])[0][0] in "aeiou":
            det = "an"
        return " ".join([det, *adj, plur if many else sing])

    def verb_group(self, person: int, many: bool) -> str:
        """Tense, aspect, modality and negation agreeing with the subject."""
        base, s3, past, part, ing = self._pick("verbs")
        third = person == 3 and not many
        r = self.rng.random()
        neg = self.rng.random() < 0.15
        if r < 0.3:
            return ("didn't " + base) if neg else past
        if r < 0.5:
            if neg:
                return ("doesn't " if third else "don't ") + base
            return s3 if third else base
        if r < 0.65:
            modal = self.rng.choice(MODALS)
            return f"{CONTRACTED_NEGATIONS[modal] if neg else modal} {base}"
        nt = "n't" if neg else ""
        if r < 0.8:
            be = "was" if third or (person == 1 and not many) else "were"
            return f"{be}{nt} {ing}"
        return f"{'has' if third else 'have'}{nt} {part}"

    def clause(self) -> str:
        subject, person, many = self.noun_phrase()
        words = [subject, self.verb_group(person, many)]
        r = self.rng
        if r.random() < 0.6:
            words.append(self._object())
        if r.random() < 0.4:
            words += [r.choice(PREPOSITIONS), self._object()]
        if r.random() < 0.2:
            words.append(self._pick("adverbs"))
        return " ".join(words)

    def sentence(self) -> str:
        """One sentence within the word limits (redrawn until it fits)."""
        while True:
            r = self.rng
            parts = [self.clause()]
            for _ in range(r.choice((0, 0, 1, 1, 2))):
                joiner = r.choice(SUBORDINATORS + CONJUNCTIONS)
                parts.append(f"{joiner} {self.clause()}")
            if r.random() < 0.1:
                parts.insert(0, r.choice(OPENERS))
            text = " ".join(parts)
            if self.min_words <= len(text.split()) <= self.max_words:
                return text


def _zipf(n: int) -> list[float]:
    return [1.0 / (rank + 1 + ZIPF_SHIFT) for rank in range(n)]
