"""A task family for long-context retrieval, generated here: many independent questions on one long document.

Each generator returns a `Document`: the context token ids (prefilled once per method), the facts planted in it at
recorded, independent depths, and many `Question`s, each answerable from the document alone, so every question is
asked on its own fork and none depends on another's answer (no order or priming confound). Instances are seeded;
`check(doc, tok)` verifies what an instance claims.

    doc = tasks.make("multi-key", tok, length=8192, n_facts=24, seed=3)
    seq = engine.new_sequence(); engine.prefill(seq, doc.ids)
    correct = [tasks.ask(engine, seq, q, router).correct for q in doc.questions]

The tasks (RULER's families, on text every Python install carries):

    passkey      20-30 keyed pass keys ("The pass key of the amber harbour is 48213.") in the repeated filler of
                 the passkey literature; each question asks one key's number. Correct: every answer token (5 digits).
    fact-prose   keyed secret words planted in real prose (standard-library docstrings); the answer is one word.
    fact-code    keyed constants ("AMBER_HARBOUR_PIN = 48213") planted in real Python source (the standard library).
    multi-key    passkeys whose keys come in near-duplicate pairs ("the amber harbour" / "the amber harvest"), so
                 each key has a distractor with a similar key and another value; the question asks one of them.
    multi-value  several keys with 3 numbers each, planted apart ("One of the special numbers for the amber harbour is
                 48213."); the question asks for all of a key's numbers, in the order they appear.
    variable     variable tracking: chains of 4 assignments ("VAR QXT = 48213", "VAR MPL = VAR QXT", ...) planted
                 in filler, interleaved with other chains; the question asks the value of a chain's last variable
                 (4 hops). Correct: the 5 digits.
    common-words aggregation (RULER's common-word extraction): a numbered list of words in which 3 words appear
                 many times and the rest a few times each; questions ask the most common, second and third most
                 common word. Correct: the word.

Correct always means teacher-forced greedy: every step's argmax is the next answer token (`observe.score_answer`).
Text and licences: the filler is the passkey literature's sentences; prose and code come from the running
interpreter's standard library (PSF License 2.0, read in memory, never shipped); word lists are this module's.

Ids are built from separately tokenised pieces (template head, haystack, each fact, the question and the template's
tail with an answer prefix), so no BPE merge crosses a piece boundary and every fact's token span is known.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from . import corpus
from .prompts import PASSKEY_FILLER, answer_ids, followup_ids, template_parts

ADJECTIVES = ("amber", "silver", "crimson", "quiet", "northern", "hollow", "golden", "frozen", "ancient", "velvet",
              "bitter", "hidden", "distant", "copper", "emerald", "scarlet", "misty", "iron", "lunar", "wooden",
              "coral", "ivory", "jade", "rusty", "sunny", "stormy", "gentle", "wild", "broken", "bright")
NOUNS = ("harbour", "lantern", "orchard", "meadow", "cathedral", "glacier", "violin", "compass", "falcon", "library",
         "canyon", "lighthouse", "teapot", "windmill", "pyramid", "volcano", "garden", "bridge", "tower", "river",
         "castle", "forest", "island", "mirror", "needle", "engine", "rocket", "saddle", "temple", "valley")
# Near-duplicate partners for multi-key: the same adjective and a noun sharing its first letters.
PARTNERS = {"harbour": "harvest", "lantern": "lanyard", "orchard": "orchid", "meadow": "mead", "cathedral": "catapult",
            "glacier": "gladiator", "violin": "violet", "compass": "compost", "falcon": "falcate", "library": "libretto",
            "canyon": "canopy", "lighthouse": "lightning", "teapot": "teacup", "windmill": "window",
            "pyramid": "pyre", "volcano": "volume", "garden": "gardener", "bridge": "bridle", "tower": "towel",
            "river": "rivet", "castle": "caster", "forest": "forge", "island": "islet", "mirror": "mire",
            "needle": "needlework", "engine": "engineer", "rocket": "rocker", "saddle": "sadness", "temple": "tempest",
            "valley": "valet"}
SECRET_WORDS = ("cardamom", "saxophone", "pomegranate", "origami", "tangerine", "nebula", "harpsichord", "walrus",
                "marzipan", "quartz", "zeppelin", "kaleidoscope", "avalanche", "chrysanthemum", "trombone", "paprika",
                "mongoose", "obsidian", "flamingo", "periscope", "accordion", "labyrinth", "turquoise", "gazebo",
                "hibiscus", "octopus", "tamarind", "xylophone", "boomerang", "pelican")
LIST_WORDS = ("apple", "basket", "candle", "desert", "eagle", "feather", "guitar", "hammer", "igloo", "jacket",
              "kettle", "ladder", "magnet", "napkin", "oyster", "pencil", "quilt", "ribbon", "sandal", "tunnel",
              "umbrella", "vessel", "wagon", "yogurt", "zipper", "anchor", "button", "carpet", "dolphin", "envelope",
              "fountain", "goblet", "helmet", "insect", "jungle", "kitten", "lemon", "marble", "noodle", "orange")
TASKS = ("passkey", "fact-prose", "fact-code", "multi-key", "multi-value", "variable", "common-words")


@dataclass(frozen=True)
class Fact:
    """One planted fact: its text, [start, end) token span in the document's ids, and its depth in [0, 1] (the
    share of the haystack before it)."""

    text: str
    span: tuple[int, int]
    depth: float


@dataclass(frozen=True)
class Question:
    """One question on a document: `ids` follow the document's ids (question, template tail, answer prefix);
    `answer` is the answer's token ids; `facts` the indices of the facts it needs; `prefix` the answer prefix's text.

    A dialogue's second turn (`two_turn`) has `first`, the question asked before it: its `ids` are then the first
    question's ids, the first question's true answer (teacher-forced) and the turn that asks this one."""

    text: str
    ids: list[int]
    answer: list[int]
    answer_text: str
    facts: tuple[int, ...]
    prefix: str = ""
    first: Question | None = None


@dataclass(frozen=True)
class Document:
    """A long context and its questions. `ids` is what a method prefills (len(ids) == length); each question's
    prompt is ids + question.ids."""

    task: str
    ids: list[int]
    facts: tuple[Fact, ...]
    questions: tuple[Question, ...]
    length: int
    source: str
    seed: int


# -- assembling ------------------------------------------------------------------------------------

def _enc(tok, s: str) -> list[int]:
    return tok(s, add_special_tokens=False)["input_ids"]


def _depths(rng: random.Random, n: int) -> list[float]:
    """n independent uniform depths in [0.02, 0.98], sorted (facts are laid out in document order)."""
    return sorted(0.02 + 0.96 * rng.random() for _ in range(n))


def _assemble(tok, task: str, hay: list[int], length: int, intro: str, facts: list[str], depths: list[float],
              questions: list[tuple[str, str, str, tuple[int, ...]]], source: str, seed: int) -> Document:
    """Lay the facts into the haystack at their depths; questions are (question, answer prefix, answer, facts)."""
    pre, _ = template_parts(tok, intro, "\n\nQ", "A")
    pieces = [_enc(tok, "\n" + f + "\n") for f in facts]
    n_fill = length - len(pre) - sum(map(len, pieces))
    if n_fill < len(facts) + 1:
        raise ValueError(f"length {length} leaves no room for a haystack around {len(facts)} facts")
    if len(hay) < n_fill:
        raise ValueError(f"length: the haystack has {len(hay)} tokens, {n_fill} are needed")
    cuts = [round(d * n_fill) for d in depths]
    ids, spans, at = list(pre), [], 0
    for cut, piece in zip(cuts, pieces):
        ids += hay[at:cut]
        spans.append((len(ids), len(ids) + len(piece)))
        ids += piece
        at = cut
    ids += hay[at:n_fill]
    qs = []
    for text, prefix, answer, needs in questions:
        p, post = template_parts(tok, intro, "\n\n" + text, prefix)
        if p != pre:
            raise ValueError("the template's head depends on the question: questions cannot share one prefill")
        qs.append(Question(text, post, answer_ids(tok, answer), answer, needs, prefix))
    return Document(task, ids, tuple(Fact(f, s, d) for f, s, d in zip(facts, spans, depths)), tuple(qs), length,
                    source, seed)


def _filler(tok, length: int) -> list[int]:
    return _enc(tok, PASSKEY_FILLER * (length // 8 + 16))


def _keys(rng: random.Random, n: int) -> list[tuple[str, str]]:
    pairs = [(a, b) for a in ADJECTIVES for b in NOUNS]
    if n > len(pairs):
        raise ValueError(f"n_facts must be at most {len(pairs)}, got {n}")
    return rng.sample(pairs, n)


def _numbers(rng: random.Random, n: int) -> list[int]:
    return rng.sample(range(10000, 100000), n)


# -- the generators --------------------------------------------------------------------------------

def _keyed_passkeys(tok, task: str, length: int, keys, nums, intro: str, rng: random.Random, seed: int) -> Document:
    """One pass key per (adjective, noun) key, planted in the filler; each key asked."""
    facts = [f"The pass key of the {a} {b} is {v}. Remember it. {v} is the pass key of the {a} {b}."
             for (a, b), v in zip(keys, nums)]
    qs = [(f"What is the pass key of the {a} {b}?", f"The pass key of the {a} {b} is", f" {v}", (i,))
          for i, ((a, b), v) in enumerate(zip(keys, nums))]
    return _assemble(tok, task, _filler(tok, length), length, intro, facts, _depths(rng, len(keys)), qs,
                     "repeated filler sentences", seed)


def passkey(tok, length: int, n_facts: int = 24, seed: int = 0) -> Document:
    rng = random.Random(seed)
    keys, nums = _keys(rng, n_facts), _numbers(rng, n_facts)
    intro = ("There are pass keys hidden inside a lot of irrelevant text. Find them and memorize them. "
             "I will quiz you about one of them.\n\n")
    return _keyed_passkeys(tok, "passkey", length, keys, nums, intro, rng, seed)


def fact_prose(tok, length: int, n_facts: int = 24, seed: int = 0) -> Document:
    rng = random.Random(seed)
    if n_facts > len(SECRET_WORDS):
        raise ValueError(f"n_facts must be at most {len(SECRET_WORDS)} for fact-prose, got {n_facts}")
    keys, words = _keys(rng, n_facts), rng.sample(SECRET_WORDS, n_facts)
    facts = [f"The secret word of the {a} {b} is {w}." for (a, b), w in zip(keys, words)]
    qs = [(f"What is the secret word of the {a} {b}?", f"The secret word of the {a} {b} is", f" {w}", (i,))
          for i, ((a, b), w) in enumerate(zip(keys, words))]
    hay = corpus.take(tok, corpus.haystack("prose"), length, offset=1000 * (seed % 7))
    return _assemble(tok, "fact-prose", hay, length, "Read the documentation below.\n\n", facts,
                     _depths(rng, n_facts), qs, "prose: " + corpus.SOURCE, seed)


def fact_code(tok, length: int, n_facts: int = 24, seed: int = 0) -> Document:
    rng = random.Random(seed)
    keys, nums = _keys(rng, n_facts), _numbers(rng, n_facts)
    names = [f"{a.upper()}_{b.upper()}_PIN" for a, b in keys]
    facts = [f"{n} = {v}  # the PIN of the {a} {b}" for n, v, (a, b) in zip(names, nums, keys)]
    qs = [(f"In the code above, what is the value of {n}?", f"{n} =", f" {v}", (i,))
          for i, (n, v) in enumerate(zip(names, nums))]
    hay = corpus.take(tok, corpus.haystack("code"), length, offset=1000 * (seed % 7))
    return _assemble(tok, "fact-code", hay, length, "Read the Python code below.\n\n", facts, _depths(rng, n_facts),
                     qs, "code: " + corpus.SOURCE, seed)


def multi_key(tok, length: int, n_facts: int = 24, seed: int = 0) -> Document:
    """n_facts passkeys in n_facts / 2 near-duplicate pairs; every key is asked (its partner is the distractor)."""
    if n_facts % 2:
        raise ValueError(f"n_facts must be even for multi-key (pairs of similar keys), got {n_facts}")
    rng = random.Random(seed)
    firsts = _keys(rng, n_facts // 2)
    keys = [k for a, b in firsts for k in ((a, b), (a, PARTNERS[b]))]
    order = list(range(n_facts))
    rng.shuffle(order)                      # partners land at independent depths
    keys = [keys[i] for i in order]
    nums = _numbers(rng, n_facts)
    intro = ("There are pass keys hidden inside a lot of irrelevant text; some keys have similar names. Find them "
             "and memorize them. I will quiz you about one of them.\n\n")
    return _keyed_passkeys(tok, "multi-key", length, keys, nums, intro, rng, seed)


def multi_value(tok, length: int, n_facts: int = 24, seed: int = 0) -> Document:
    """n_facts // 3 keys with 3 numbers each, each number its own fact at its own depth."""
    if n_facts % 3:
        raise ValueError(f"n_facts must be a multiple of 3 for multi-value (3 values per key), got {n_facts}")
    rng = random.Random(seed)
    keys, nums = _keys(rng, n_facts // 3), _numbers(rng, n_facts)
    owner = [i // 3 for i in range(n_facts)]
    rng.shuffle(owner)                      # which key each depth-ordered fact belongs to
    facts = [f"One of the special numbers for the {keys[k][0]} {keys[k][1]} is {v}." for k, v in zip(owner, nums)]
    qs = []
    for k, (a, b) in enumerate(keys):
        mine = [i for i in range(n_facts) if owner[i] == k]          # in document order
        qs.append((f"What are all the special numbers for the {a} {b}? List them in the order they appear.",
                   f"The special numbers for the {a} {b} are", " " + ", ".join(str(nums[i]) for i in mine),
                   tuple(mine)))
    intro = ("Some special numbers are hidden inside a lot of irrelevant text. Find them and memorize them. "
             "I will quiz you about them.\n\n")
    return _assemble(tok, "multi-value", _filler(tok, length), length, intro, facts, _depths(rng, n_facts), qs,
                     "repeated filler sentences", seed)


def variable(tok, length: int, n_facts: int = 24, seed: int = 0, hops: int = 4) -> Document:
    """n_facts // hops chains of `hops` assignments, interleaved; each chain's last variable is asked."""
    if n_facts % hops:
        raise ValueError(f"n_facts must be a multiple of hops={hops} for variable tracking, got {n_facts}")
    rng = random.Random(seed)
    n_chains = n_facts // hops
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    names = set()
    while len(names) < n_facts:
        names.add("".join(rng.choice(letters) for _ in range(3)))
    names = sorted(names)
    rng.shuffle(names)
    chains = [names[c * hops:(c + 1) * hops] for c in range(n_chains)]
    values = _numbers(rng, n_chains)
    # Interleave: a random order of all assignments that keeps each chain's own order.
    slots = [c for c in range(n_chains) for _ in range(hops)]
    rng.shuffle(slots)
    step = [0] * n_chains
    facts, fact_of = [], {}
    for c in slots:
        h = step[c]
        var = chains[c][h]
        facts.append(f"VAR {var} = {values[c]}" if h == 0 else f"VAR {var} = VAR {chains[c][h - 1]}")
        fact_of[c, h] = len(facts) - 1
        step[c] += 1
    qs = [(f"What is the value of VAR {chains[c][-1]}?", f"VAR {chains[c][-1]} =", f" {values[c]}",
           tuple(fact_of[c, h] for h in range(hops))) for c in range(n_chains)]
    intro = ("Memorize and track the chains of variable assignments hidden in the following text. "
             "I will ask you the value of one variable.\n\n")
    return _assemble(tok, "variable", _filler(tok, length), length, intro, facts, _depths(rng, n_facts), qs,
                     "repeated filler sentences", seed)


def common_words(tok, length: int, n_facts: int = 3, seed: int = 0) -> Document:
    """A numbered word list in `length` tokens: n_facts frequent words, each appearing a distinct number of times
    and more than twice as often as any other word, which appear a few times each; filler pads the end. Facts are
    the frequent words' first occurrences (their text: the word and its count); question r asks the r-th most
    common word."""
    if not 1 <= n_facts <= 5:
        raise ValueError(f"n_facts must be 1..5 for common-words (the most common words asked), got {n_facts}")
    rng = random.Random(seed)
    words = rng.sample(LIST_WORDS, len(LIST_WORDS))
    common, rare = words[:n_facts], words[n_facts:]
    intro = "Below is a numbered list of words. Memorize the ones that appear most often.\n\n"
    pre, _ = template_parts(tok, intro, "\n\nQ", "A")
    widest = max(len(_enc(tok, f"{10 ** k}. {w}\n")) for k in range(1, 5) for w in LIST_WORDS)
    n_items = (length - len(pre)) // widest                 # every item fits: the list never runs past `length`
    rare_each = max(1, n_items // (len(rare) * 6))
    left = n_items - rare_each * len(rare)
    top = [left * (n_facts + 1 - r) // sum(range(1, n_facts + 2)) for r in range(n_facts)]
    if len(set(top)) != n_facts or min(top) <= 2 * rare_each:
        raise ValueError(f"length {length} is too short for a list whose {n_facts} common words stand out")
    counts = {**{w: c for w, c in zip(common, top)}, **{w: rare_each for w in rare}}
    order = [w for w, c in counts.items() for _ in range(c)]
    rng.shuffle(order)
    ids, first = list(pre), {}
    for i, w in enumerate(order):
        piece = _enc(tok, f"{i + 1}. {w}\n")
        if w in counts and w in common and w not in first:
            first[w] = (len(ids), len(ids) + len(piece))
        ids += piece
    ids += _filler(tok, length)[: length - len(ids)]
    ords = ("most common", "second most common", "third most common", "fourth most common", "fifth most common")
    qs = []
    for r, w in enumerate(common):                           # `top` is decreasing: common[r] is the r-th most common
        q = f"What is the {ords[r]} word in the list above?"
        prefix = f"The {ords[r]} word is"
        p, post = template_parts(tok, intro, "\n\n" + q, prefix)
        qs.append(Question(q, post, answer_ids(tok, f" {w}"), f" {w}", (r,), prefix))
    facts = tuple(Fact(f"{w} appears {counts[w]} times", first[w], (first[w][0] - len(pre)) / (len(ids) - len(pre)))
                  for w in common)
    return Document("common-words", ids, facts, tuple(qs), length, "this module's word list", seed)


GENERATORS = {"passkey": passkey, "fact-prose": fact_prose, "fact-code": fact_code, "multi-key": multi_key,
              "multi-value": multi_value, "variable": variable, "common-words": common_words}


def make(task: str, tok, length: int, n_facts: int | None = None, seed: int = 0) -> Document:
    """One seeded instance of `task` (TASKS) with `length` context tokens."""
    if task not in GENERATORS:
        raise ValueError(f"task must be one of {list(GENERATORS)}, got {task!r}")
    kw = {} if n_facts is None else {"n_facts": n_facts}
    return GENERATORS[task](tok, length, seed=seed, **kw)


# -- checking and asking --------------------------------------------------------------------------

def check(doc: Document, tok) -> None:
    """Raise AssertionError unless the instance holds what it claims: the document is `length` ids; every fact's
    span decodes to its text, in document order, at its recorded depth; no two questions are the same and every
    answer is unique among a task's answers; every answer's value appears in the document only inside the facts
    the question names (so a right answer comes from the planted facts, not the haystack)."""
    assert len(doc.ids) == doc.length, (len(doc.ids), doc.length)
    starts = [f.span[0] for f in doc.facts]
    if doc.task != "common-words":
        assert starts == sorted(starts), "facts out of document order"
        depths = [f.depth for f in doc.facts]
        assert depths == sorted(depths) and all(0 <= d <= 1 for d in depths)
    for f in doc.facts:
        text = tok.decode(doc.ids[f.span[0]:f.span[1]])
        assert (f.text.split()[0] if doc.task == "common-words" else f.text) in text, (f.text, text)
    assert len({q.text for q in doc.questions}) == len(doc.questions), "a question repeats"
    assert len({q.answer_text for q in doc.questions}) == len(doc.questions), "an answer is not unique"
    if doc.task == "common-words":          # the counts the facts claim, read back from the list's lines
        lines = [ln.split(". ", 1)[1] for ln in tok.decode(doc.ids).splitlines() if ". " in ln and ln.split(". ")[0].isdigit()]
        claimed = [int(f.text.split()[2]) for f in doc.facts]
        assert [lines.count(f.text.split()[0]) for f in doc.facts] == claimed, "a common word's count is wrong"
        others = max(lines.count(w) for w in set(lines) - {f.text.split()[0] for f in doc.facts})
        assert claimed == sorted(claimed, reverse=True) and len(set(claimed)) == len(claimed) \
            and min(claimed) > 2 * others, "the common words do not stand out"
        return
    full = tok.decode(doc.ids)
    for q in doc.questions:
        for value in q.answer_text.strip().split(", "):
            inside = sum(tok.decode(doc.ids[doc.facts[i].span[0]:doc.facts[i].span[1]]).count(value) for i in q.facts)
            assert inside >= 1, (q.text, value)
            assert full.count(value) == sum(tok.decode(doc.ids[f.span[0]:f.span[1]]).count(value) for f in doc.facts), \
                f"{value!r} also appears in the haystack"


def two_turn(tok, doc: Document, n: int, seed: int = 0) -> tuple[Question, ...]:
    """`n` two-turn dialogues on `doc`, counterbalanced: each asks one of its questions, takes the true answer
    (teacher-forced: the dialogue a user has after a right first answer), then asks another; it is scored on the
    second answer. The 2n questions involved are distinct (each asked once, in one dialogue), drawn by `seed`; pairs
    are shuffled, then dialogue d asks the earlier of its two facts first when d is even and the later first when d
    is odd, so exactly half the dialogues ask the later fact first and order is not tied to depth.

    Returns the second turns (`Question.first` set, facts those of the question asked second); each is asked on its
    own fork like any question (`ask`). ValueError unless n is an even int with 2 <= n <= len(questions) // 2 and
    every question of `doc` names one fact with its answer prefix."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 2 or n % 2 or 2 * n > len(doc.questions):
        raise ValueError(f"n must be an even int in [2, {len(doc.questions) // 2}] (two questions per dialogue, half "
                         f"of them later-first), got {n!r}")
    if any(len(q.facts) != 1 or not q.prefix or q.first is not None for q in doc.questions):
        raise ValueError("doc: every question must name one fact and its answer prefix (a generator's questions)")
    rng = random.Random(seed)
    picked = rng.sample(range(len(doc.questions)), 2 * n)
    depth = lambda i: doc.facts[doc.questions[i].facts[0]].depth
    out = []
    for d in range(n):
        early, late = sorted(picked[2 * d:2 * d + 2], key=depth)
        first, second = (early, late) if d % 2 == 0 else (late, early)
        a, b = doc.questions[first], doc.questions[second]
        ids = a.ids + a.answer + followup_ids(tok, b.text, b.prefix)
        out.append(Question(b.text, ids, b.answer, b.answer_text, b.facts, b.prefix, a))
    return tuple(out)


def ask(engine, seq, question: Question, router=None, rule: str = "dense", keep_logprobs: bool = False):
    """Ask one question on a fork of `seq` (which holds the document's ids): the question's tokens (all but the last)
    are prefilled densely over the context in one chunked pass (rule "dense": Quest's protocol, and how a
    compressed cache's peers are asked) or fed as routed decode steps (rule "routed"); then the answer is scored
    teacher-forced (`observe.score_answer`, `keep_logprobs` passed on) with `router`, from the question's last token
    on. Returns the observe.Answer."""
    from .observe import score_answer
    if rule not in ("dense", "routed"):
        raise ValueError(f"rule must be 'dense' or 'routed', got {rule!r}")
    child = engine.fork(seq)
    try:
        if len(question.ids) > 1 and rule == "dense":
            engine.prefill(child, question.ids[:-1])
        elif len(question.ids) > 1:
            engine.feed(child, question.ids[:-1], router=router, logits="last")   # only the K/V matter here
        return score_answer(engine, child, question.ids[-1], question.answer, router, keep_logprobs=keep_logprobs)
    finally:
        engine.finish(child)


__all__ = ["TASKS", "Fact", "Question", "Document", "GENERATORS", "make", "check", "two_turn", "ask", "passkey",
           "fact_prose", "fact_code", "multi_key", "multi_value", "variable", "common_words"]
