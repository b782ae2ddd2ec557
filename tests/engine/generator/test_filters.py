"""Job filters (JSON schema, regex, choices) on real models: outputs always match, jobs end with "end_filter",
background mask evaluation changes nothing, unfiltered neighbours are untouched, bad filters fail early."""

from __future__ import annotations

import json
import re
import threading

import pytest
import torch

from engine.cache import Cache
from engine.generator.dynamic import DynamicGenerator
from engine.generator.filters import ChoiceFilter, JSONFilter, RegexFilter
from engine.generator.job import DynamicJob
from engine.generator.sampler import SamplerSettings
from engine.models import Model

HOT = SamplerSettings(temperature=1.5, top_k=0, top_p=1.0, token_repetition_penalty=1.0)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    # These runs are many tiny per-sequence ops: on a small, busy CPU, intra-op threads spin-wait more than they
    # help (the starter runs take ~5x longer with two threads on two shared cores).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_gen(model, pages=96, page_size=16, **kw):
    cache = Cache(model, max_seq_len=pages * page_size, page_size=page_size)
    return DynamicGenerator(model, cache, model.tokenizer, **kw)


def run_jobs(gen, jobs) -> dict[object, dict]:
    """Run jobs to the end -> identifier -> {"ids", "text", "eos" (last result), "suppressed"}."""
    out = {j.identifier: {"ids": [], "text": "", "eos": None, "suppressed": []} for j in jobs}
    gen.enqueue(jobs)
    for _ in range(2000):
        if not gen.num_remaining_jobs():
            break
        for r in gen.iterate():
            o = out[r["identifier"]]
            if "token_ids" in r:
                o["ids"] += r["token_ids"][0].tolist()
            o["text"] += r.get("text", "")
            if "suppressed_text" in r:
                o["suppressed"].append(r["suppressed_text"])
            if r["eos"]:
                o["eos"] = r
    assert not gen.num_remaining_jobs(), "generator did not finish"
    return out


def tiny_prompt(model, seed: int, n: int = 8) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, model.config.vocab_size, (n,), generator=g).tolist()


# ------------------------------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize(
    "make",
    [
        lambda: JSONFilter({"type": "bogus"}),
        lambda: JSONFilter({"type": "object", "required": 5}),
        lambda: JSONFilter({"$ref": "#/nowhere"}),
        lambda: JSONFilter({"type": "string", "pattern": "[a-"}),
        lambda: JSONFilter("{not json"),
        lambda: JSONFilter(42),
        lambda: RegexFilter("[a-"),
        lambda: RegexFilter("(?=a)b"),  # look-around is not regular
        lambda: RegexFilter(""),
        lambda: ChoiceFilter([]),
        lambda: ChoiceFilter(["yes", ""]),
        lambda: ChoiceFilter("yes"),
        lambda: ChoiceFilter(["yes", 3]),
    ],
)
def test_invalid_filters_raise_value_error(make):
    with pytest.raises(ValueError) as e:
        make()
    assert "Filter" in str(e.value) or "not valid" in str(e.value)


@pytest.mark.parametrize("filters", [["abc"], [re.compile("a+")], {"type": "object"}, [None], "json"])
def test_job_rejects_filters_of_a_wrong_type(filters):
    with pytest.raises(ValueError, match="filters must"):
        DynamicJob([1, 2, 3], 4, filters=filters)


def test_token_healing_with_filters_is_refused():
    with pytest.raises(ValueError, match="token_healing cannot be combined with filters"):
        DynamicJob([1, 2, 3], 4, filters=[RegexFilter("[a-z]+")], token_healing=True)


def test_error_messages_name_the_problem():
    with pytest.raises(ValueError, match="Invalid type: bogus"):
        JSONFilter({"type": "bogus"})
    with pytest.raises(ValueError, match="unclosed character class"):
        RegexFilter("[a-")
    with pytest.raises(ValueError, match="empty list"):
        ChoiceFilter([])


# --------------------------------------------------------------------------------------- tiny model


def test_regex_and_choices_always_match_on_the_tiny_model(tiny_model):
    choices = ['say "hi"', "line\nbreak", "Zwölf 🦊", "one two"]
    regex = r"[a-c]{2,5}-[0-9]{1,3}"
    jobs = []
    for seed in range(8):
        prompt = tiny_prompt(tiny_model, seed)
        jobs.append(
            DynamicJob(prompt, 40, gen_settings=HOT, seed=seed, filters=[RegexFilter(regex)], identifier=("r", seed))
        )
        jobs.append(
            DynamicJob(prompt, 40, gen_settings=HOT, seed=seed, filters=ChoiceFilter(choices), identifier=("c", seed))
        )
    out = run_jobs(make_gen(tiny_model), jobs)
    picked = set()
    for (kind, _), o in out.items():
        if kind == "r":
            assert re.fullmatch(regex, o["text"]), o["text"]
        else:
            assert o["text"] in choices
            picked.add(o["text"])
        assert o["text"] == o["eos"]["full_completion"]
    # A run ends when the match is complete, or by sampling EOS where the regex could go on: both "end_filter".
    assert all(o["eos"]["eos_reason"] == "end_filter" for o in out.values())
    assert len(picked) >= 2, "sampling should reach different choices"


def test_several_filters_intersect(tiny_model):
    filters = [RegexFilter("[a-z]+"), ChoiceFilter(["abc", "ABC", "xyz", "x1"])]
    jobs = [
        DynamicJob(tiny_prompt(tiny_model, s), 10, gen_settings=HOT, seed=s, filters=filters, identifier=s)
        for s in range(6)
    ]
    out = run_jobs(make_gen(tiny_model), jobs)
    assert {o["text"] for o in out.values()} <= {"abc", "xyz"}
    assert all(o["eos"]["eos_reason"] == "end_filter" for o in out.values())


def test_filter_prefer_eos_ends_at_the_first_complete_match(tiny_model):
    eos_id = tiny_model.tokenizer.eos_token_id
    regex = RegexFilter("[0-9]+")
    free, eager = [], []
    for s in range(6):
        p = tiny_prompt(tiny_model, 20 + s)
        free.append(DynamicJob(p, 12, gen_settings=HOT, seed=s, filters=[regex], identifier=s))
        eager.append(DynamicJob(p, 12, gen_settings=HOT, seed=s, filters=[regex], filter_prefer_eos=True, identifier=s))
    free_out, eager_out = run_jobs(make_gen(tiny_model), free), run_jobs(make_gen(tiny_model), eager)
    for o in eager_out.values():
        # One token of digits, then EOS (forced as soon as the match is complete).
        assert o["ids"][1:] == [eos_id] and o["text"].isdigit()
        assert o["eos"]["eos_reason"] == "end_filter"
    assert any(len(o["ids"]) > 2 for o in free_out.values()), "without prefer_eos some runs write more digits"
    assert all(o["text"].isdigit() for o in free_out.values())
    # With EOS as a stop condition the same job reports the stop token, as exllamav2 does.
    stop = DynamicJob(
        tiny_prompt(tiny_model, 20),
        12,
        gen_settings=HOT,
        seed=0,
        filters=[regex],
        filter_prefer_eos=True,
        stop_conditions=[eos_id],
        identifier="s",
    )
    eos = run_jobs(make_gen(tiny_model), [stop])["s"]["eos"]
    assert eos["eos_reason"] == "stop_token" and eos["eos_triggering_token_id"] == eos_id


def test_min_new_tokens_holds_back_the_end_of_a_filtered_job(tiny_model):
    eos_id = tiny_model.tokenizer.eos_token_id
    jobs = [
        DynamicJob(
            tiny_prompt(tiny_model, s),
            12,
            min_new_tokens=4,
            gen_settings=HOT,
            seed=s,
            identifier=s,
            filters=[RegexFilter("[0-9]+")],
            filter_prefer_eos=True,
        )
        for s in range(4)
    ]
    for o in run_jobs(make_gen(tiny_model), jobs).values():
        assert len(o["ids"]) == 5 and o["ids"][-1] == eos_id and o["text"].isdigit()


def test_unfiltered_job_is_identical_with_filtered_neighbours(tiny_model):
    def free_job():
        return DynamicJob(tiny_prompt(tiny_model, 99, 20), 24, gen_settings=HOT, seed=5, identifier="free")

    alone = run_jobs(make_gen(tiny_model), [free_job()])["free"]
    neighbours = [
        DynamicJob(
            tiny_prompt(tiny_model, s),
            24,
            gen_settings=HOT,
            seed=s,
            identifier=s,
            filters=[
                JSONFilter({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "maxItems": 3})
            ],
        )
        for s in range(3)
    ]
    together = run_jobs(make_gen(tiny_model), [*neighbours, free_job()])
    assert together["free"]["ids"] == alone["ids"] and together["free"]["text"] == alone["text"]
    for s in range(3):
        value = json.loads(together[s]["text"])
        assert isinstance(value, list) and len(value) <= 3 and all(isinstance(v, int) and 0 <= v <= 99 for v in value)
        assert together[s]["eos"]["eos_reason"] == "end_filter"


@pytest.mark.parametrize("min_threads", [1, 8])  # one task per job / one task for all jobs
def test_background_eval_on_and_off_give_identical_outputs(tiny_model, min_threads):
    schema = {"type": "object", "properties": {"k": {"type": "string", "maxLength": 4}}, "required": ["k"]}

    def jobs():
        out = []
        for s in range(4):
            p = tiny_prompt(tiny_model, 40 + s)
            out.append(DynamicJob(p, 30, gen_settings=HOT, seed=s, filters=[JSONFilter(schema)], identifier=("j", s)))
            out.append(
                DynamicJob(p, 30, gen_settings=HOT, seed=s, filters=[RegexFilter("[a-z ]{3,30}")], identifier=("r", s))
            )
        out.append(DynamicJob(tiny_prompt(tiny_model, 50), 30, gen_settings=HOT, seed=9, identifier="free"))
        return out

    on_gen = make_gen(tiny_model, filter_background_eval=True, min_sampling_threads=min_threads, max_sampling_threads=3)
    off_gen = make_gen(tiny_model, filter_background_eval=False)
    on, off = run_jobs(on_gen, jobs()), run_jobs(off_gen, jobs())
    assert on_gen._mask_workers._pool is not None and off_gen._mask_workers is None
    assert any(t.name.startswith("tandem-filter") for t in threading.enumerate()), "masks ran on no worker thread"
    for key in on:
        assert on[key]["ids"] == off[key]["ids"], key
    assert len({on[("r", s)]["text"] for s in range(4)}) > 1, "seeds should give different outputs"


def test_banned_string_rolls_the_filter_back(tiny_model):
    # Runs that start "yes sir" are rewound: the filter must roll back with them and then allow "no sir".
    settings = SamplerSettings(temperature=1.0, top_k=0, top_p=1.0, token_repetition_penalty=1.0)
    jobs = [
        DynamicJob(
            tiny_prompt(tiny_model, 60 + s),
            20,
            gen_settings=settings,
            seed=s,
            identifier=s,
            filters=[ChoiceFilter(["yes sir", "no sir"])],
            banned_strings=["yes"],
        )
        for s in range(10)
    ]
    out = run_jobs(make_gen(tiny_model), jobs)
    assert all(o["text"] == "no sir" and o["eos"]["eos_reason"] == "end_filter" for o in out.values())
    assert any(o["suppressed"] for o in out.values()), "no run started with 'yes': the rollback went untested"


def test_compat_generator_with_filter_background_eval(tiny_model):
    from engine.compat.exllamav2 import ExLlamaV2DynamicGenerator, ExLlamaV2DynamicJob, ExLlamaV2Sampler

    cache = Cache(tiny_model, max_seq_len=1024, page_size=16)
    for background in (True, False):
        # The seed document's constructor keywords.
        generator = ExLlamaV2DynamicGenerator(
            model=tiny_model, cache=cache, tokenizer=tiny_model.tokenizer, filter_background_eval=background
        )
        job = ExLlamaV2DynamicJob(
            input_ids=torch.tensor([tiny_prompt(tiny_model, 3)]),
            max_new_tokens=20,
            gen_settings=ExLlamaV2Sampler.Settings(temperature=1.0),
            filters=[ChoiceFilter(["red", "green", "blue"])],
            identifier="c",
        )
        out = run_jobs(generator, [job])["c"]
        assert out["text"] in ("red", "green", "blue") and out["eos"]["eos_reason"] == "end_filter"


# -------------------------------------------------------------------------------- starter (49k vocab)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
DATE = r"20[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
COLOURS = ["red", "green", "blue", "dark purple"]


@pytest.fixture(scope="module")
def starter_runs(starter_gguf):
    """50 sampled JSON jobs, 4 regex jobs and 4 choice jobs on the starter model, run together once."""
    model = Model.load(starter_gguf)
    tok = model.tokenizer
    chat = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
    settings = SamplerSettings(temperature=1.0, top_k=50, top_p=1.0, token_repetition_penalty=1.0)
    jobs = []
    for kind, question, filters, n, max_new in (
        ("json", "Describe a person as JSON.", [JSONFilter(PERSON)], 50, 40),
        ("date", "When did it happen?", [RegexFilter(DATE)], 4, 16),
        ("choice", "Name a colour.", [ChoiceFilter(COLOURS)], 4, 8),
    ):
        prompt = tok.encode(chat.format(question), encode_special_tokens=True)
        jobs += [
            DynamicJob(prompt, max_new, gen_settings=settings, seed=1000 + s, filters=filters, identifier=(kind, s))
            for s in range(n)
        ]
    gen = make_gen(model, pages=256, page_size=16)
    return run_jobs(gen, jobs)


def test_json_schema_output_parses_over_50_seeded_runs(starter_runs):
    texts = []
    for (kind, seed), o in starter_runs.items():
        if kind != "json":
            continue
        assert o["eos"]["eos_reason"] == "end_filter", (seed, o["text"])
        value = json.loads(o["text"])
        assert set(value) == {"name", "age"}, o["text"]
        assert isinstance(value["name"], str) and len(value["name"]) <= 8
        assert isinstance(value["age"], int) and not isinstance(value["age"], bool) and 0 <= value["age"] <= 150
        texts.append(o["text"])
    assert len(texts) == 50
    assert len(set(texts)) >= 20, "temperature 1 should give varied outputs"


def test_regex_and_choices_match_with_a_real_vocabulary(starter_runs):
    for (kind, _), o in starter_runs.items():
        if kind == "date":
            assert re.fullmatch(DATE, o["text"]), o["text"]
        elif kind == "choice":
            assert o["text"] in COLOURS and o["eos"]["eos_reason"] == "end_filter"
            # A choice is complete on its last token: the job ends there, without sampling EOS first.
            assert o["ids"][-1] != 2  # SmolLM2's only end-of-sequence id, <|im_end|>
