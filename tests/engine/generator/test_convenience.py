"""generate() as a plain function over a generator, and the seed documents' method that calls it."""

from __future__ import annotations

import inspect

from engine.generator import convenience
from engine.generator.dynamic import DynamicGenerator
from engine.generator.sampler import SamplerSettings

from .test_dynamic import greedy_job, make_gen


def test_the_method_takes_the_functions_parameters_with_the_same_defaults():
    method = list(inspect.signature(DynamicGenerator.generate).parameters.values())[1:]  # without self
    function = list(inspect.signature(convenience.generate).parameters.values())[1:]  # without the generator
    assert [(p.name, p.default, p.kind) for p in method] == [(p.name, p.default, p.kind) for p in function]


def test_the_function_and_the_method_complete_alike(tiny_model):
    greedy = SamplerSettings.greedy()
    by_method = make_gen(tiny_model).generate("The quick brown", max_new_tokens=6, gen_settings=greedy)
    by_function = convenience.generate(make_gen(tiny_model), "The quick brown", 6, gen_settings=greedy)
    assert by_method == by_function and by_method.startswith("The quick brown")
    text, last = convenience.generate(
        make_gen(tiny_model), ["One two"], 4, gen_settings=greedy, completion_only=True, return_last_results=True
    )
    assert len(text) == 1 and last[0]["eos"] and last[0]["new_tokens"] == 4


def test_kept_results_come_first_from_the_next_iterate(tiny_model):
    gen = make_gen(tiny_model)
    gen.enqueue(greedy_job([9] * 10, 5, "other"))
    first = gen.iterate()
    assert first
    gen.keep_results(first)
    again = gen.iterate()
    assert len(again) > len(first) and all(a is b for a, b in zip(again, first))  # then this step's own results
