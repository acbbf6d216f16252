"""Whether a collection is in English, the language everything a build makes is for, and BM25's analyzer if not.

The bi-encoder and the rankers start from all-MiniLM-L6-v2 (trained on English), and keyword pseudo-queries drop
English stopwords. So the collection stage counts the most common function words of English and of six other
European languages, and the share of letters outside the Latin script: where the texts look like one of those six,
``aheadrank build --language auto`` (the default) indexes BM25 with Lucene's analyzer for it instead of the English
one (:func:`bm25_language`), and :func:`language_warning` says in one line that the rest is made for English and
its ranking was not measured on such text; the same for another script, whose BM25 stays English. It is a guess
from counts, not a language detector: texts with few function words (product names, titles, codes) guess nothing
and get no warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aheadrank.textio import EDGE_PUNCTUATION

# frequent function words of each language; a word on two lists (que, con, des, ...) counts for neither
_LISTS = {
    "en": frozenset("the of and to is that for with was are this be from by have".split()),
    "fr": frozenset("le les des et est une du que dans pour qui sur au pas ce".split()),
    "de": frozenset("der und das ist den von zu mit sich des auf für nicht ein eine".split()),
    "es": frozenset("el los las del que y por con una para es se lo como más".split()),
    "it": frozenset("il di che per non una sono della gli si con le nel anche è".split()),
    "pt": frozenset("não da do em uma os no na por com um ao mais às também".split()),
    "nl": frozenset("het een van en dat op te voor zijn niet met die ook bij maar".split()),
}
FUNCTION_WORDS = {
    code: frozenset(w for w in words if sum(w in other for other in _LISTS.values()) == 1)
    for code, words in _LISTS.items()
}
NAMES = {
    "en": "English",
    "fr": "French",
    "de": "German",
    "es": "Spanish",
    "it": "Italian",
    "pt": "Portuguese",
    "nl": "Dutch",
}
# the analyzers a BM25 index can be built with (Lucene's, through Anserini's -language): the languages guessed here
BM25_LANGUAGES = tuple(NAMES)


def check_bm25_language(language: str, error: type[Exception] = ValueError) -> str:
    """``language`` when it is one of :data:`BM25_LANGUAGES`, else ``error`` naming them."""
    if language not in BM25_LANGUAGES:
        raise error(f"unknown BM25 language {language!r}: one of {', '.join(BM25_LANGUAGES)}")
    return language


def analyzer_name(language: str) -> str:
    """What an index's record says of its analyzer."""
    if language == "en":
        return "Anserini default English (Porter stemmer, stopwords removed)"
    return f"Lucene's {NAMES[language]} analyzer (Anserini -language {language})"


def bm25_language(guess: str | None) -> str:
    """The BM25 analyzer for a collection whose :meth:`LanguageCounts.guess` is ``guess``: its language where it is
    one of :data:`BM25_LANGUAGES`, else English (another script, or nothing recognised)."""
    return guess if guess in BM25_LANGUAGES else "en"


# a guess is made when its function words are at least this share of all words and twice English's: English texts
# are about 0.2 English function words (SciFact 0.21, Cranfield 0.27, Vaswani 0.27, MS MARCO passages 0.22, SciFact's
# titles cut to 8 words 0.19; bench/language_shares.py) and 0.002 or less of any other list's; a foreign language's
# prose as much of its own
MIN_SHARE = 0.08
NON_LATIN = 0.5  # letters outside the Latin script (a-z with their accents): above this share, another script
MAX_WORDS = 200_000  # words counted: enough for a guess, and the collection stage stays a read


@dataclass
class LanguageCounts:
    """Counts over a collection's texts, :meth:`add` each; :meth:`guess` and :meth:`summary` after."""

    words: int = 0
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FUNCTION_WORDS, 0))
    letters: int = 0
    non_latin: int = 0

    def add(self, text: str) -> None:
        if self.words >= MAX_WORDS:
            return
        for word in text.lower().split():
            word = word.strip(EDGE_PUNCTUATION)
            self.words += 1
            for code, words in FUNCTION_WORDS.items():
                if word in words:
                    self.hits[code] += 1
        letters = [c for c in text if c.isalpha()]
        self.letters += len(letters)
        self.non_latin += sum(not _latin(c) for c in letters)

    def shares(self) -> dict[str, float]:
        return {code: n / max(self.words, 1) for code, n in self.hits.items()}

    def guess(self) -> str | None:
        """The guess: "non-latin", a language code other than "en" (the texts look like it), or None (English, or
        nothing else recognised)."""
        if self.letters and self.non_latin / self.letters > NON_LATIN:
            return "non-latin"
        shares = self.shares()
        code = max(shares, key=lambda c: shares[c])
        if code != "en" and shares[code] >= MIN_SHARE and shares[code] >= 2 * shares["en"]:
            return code
        return None

    def summary(self) -> dict:
        """What ``build.json`` records: the guess, English's share of function words and the top other's."""
        shares = self.shares()
        other = max((c for c in shares if c != "en"), key=lambda c: shares[c])
        return {
            "guess": self.guess() or "en",  # en: nothing else recognised (names and codes too)
            "english_share": round(shares["en"], 4),
            "other": {other: round(shares[other], 4)},
            "non_latin_letters": round(self.non_latin / max(self.letters, 1), 4),
        }


def _latin(c: str) -> bool:
    """ASCII, or a letter of Latin-1 Supplement or Latin Extended-A/B (é, ß, ø, ł, ...)."""
    return c.isascii() or "\u00c0" <= c <= "\u024f"


def language_warning(counts: LanguageCounts, collection: object, bm25: str = "en") -> str | None:
    """The line a build warns with when ``collection``'s texts do not look English, else None. ``bm25``: the
    language of the analyzer its BM25 index is built with."""
    guess = counts.guess()
    if guess is None:
        return None
    what = (
        f"{counts.non_latin / max(counts.letters, 1):.0%} of its letters are not in the Latin script"
        if guess == "non-latin"
        else f"{counts.shares()[guess]:.0%} of its words are common {NAMES[guess]} words, "
        f"{counts.shares()['en']:.0%} common English ones"
    )
    analyzer = (
        f"BM25 indexes it with Lucene's {NAMES[bm25]} analyzer, but" if bm25 != "en" else "BM25's analyzer,"
    )
    return (
        f"{collection} does not look English ({what}): {analyzer} the bi-encoder and the rankers are made for "
        "English, so this build will run and serve, but its ranking has not been measured on such text"
    )
