"""The one fake the tests may use: a scripted model behind the engine interface."""
from machinery.engine import GenOutput


class ScriptedEngine:
    """Plays back assistant turns (as text) in order, tokenized with a real tokenizer.

    It records every input it was given, so tests can check the token-in, token-out contract.
    A turn that does not fit `max_new_tokens` is cut there with finish_reason "length", as a real
    engine would.
    """

    def __init__(self, tokenizer, turns, logprob: float = -0.25):
        self.tok, self.turns, self.logprob = tokenizer, list(turns), logprob
        self.inputs: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def generate(self, input_ids, params):
        self.inputs.append(list(input_ids))
        if not self.turns:
            raise AssertionError("the script ran out of turns")
        ids = self.tok.encode(self.turns.pop(0), add_special_tokens=False)
        finish = "stop"
        if len(ids) > params.max_new_tokens:
            ids, finish = ids[:params.max_new_tokens], "length"
        self.outputs.append(ids)
        return GenOutput(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish)

    async def score(self, input_ids, start):
        return [self.logprob] * (len(input_ids) - start)

    def shutdown(self):
        pass  # nothing to free
