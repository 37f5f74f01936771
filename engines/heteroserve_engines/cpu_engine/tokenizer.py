"""Tokenizer and chat template from GGUF metadata: the `tokenizers` library for BPE, sandboxed
Jinja2 for the template, following llama.cpp's reading of the same fields."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cache

from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

from .gguf_file import GGUFFile
from .gguf_model import ModelFileError

CONTROL = 3  # llama_token_type: control tokens (<|im_start|>, ...)
USER_DEFINED = 4
# GPT-2's split pattern; llama.cpp's "smollm"/"gpt2" pre-tokenizers split on it (smollm first
# splits every digit on its own).
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character a vocabulary entry uses -> the byte
    it stands for (printable bytes stand for themselves, the others for 256 + n)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class ChatTemplateError(ValueError):
    """The model's chat template refused the messages (its raise_exception, or an error)."""


@dataclass
class GGUFTokenizer:
    tokenizer: Tokenizer
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    chat_template: str | None
    special_ids: frozenset[int] = frozenset()
    _bytes: dict[int, bytes] = field(default_factory=dict, repr=False)
    # The most UTF-8 bytes one token stands for: a text of n bytes has at least n / this
    # many tokens (a bound that refuses a prompt far over the context without encoding it).
    max_token_bytes: int = 1
    # The chat template compiled once (_template): compiling it costs milliseconds of the GIL
    # per request, which stalled the event loop behind a burst of admitted requests.
    _compiled: tuple[str, Template] | None = field(default=None, repr=False)
    _compile_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_gguf(cls, reader: GGUFFile) -> GGUFTokenizer:
        kind = reader.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelFileError(f"tokenizer model {kind!r} is not supported (gpt2 BPE)")
        tokens = reader.get("tokenizer.ggml.tokens")
        if not tokens:
            raise ModelFileError("GGUF metadata 'tokenizer.ggml.tokens' is missing")
        types = reader.get("tokenizer.ggml.token_type", [1] * len(tokens))
        merges = [tuple(m.split(" ", 1)) for m in reader.get("tokenizer.ggml.merges", [])]
        vocab = {token: index for index, token in enumerate(tokens)}
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        split = pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated")
        steps = [split, byte_level]
        if reader.get("tokenizer.ggml.pre") == "smollm":
            steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(steps)
        tokenizer.decoder = decoders.ByteLevel()
        special = [tokens[i] for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)]
        tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                      for t in special])
        bos = reader.get("tokenizer.ggml.bos_token_id")
        eos = reader.get("tokenizer.ggml.eos_token_id")
        made = cls(
            tokenizer=tokenizer,
            bos_id=None if bos is None else int(bos),
            eos_id=None if eos is None else int(eos),
            add_bos=bool(reader.get("tokenizer.ggml.add_bos_token", True)),
            chat_template=reader.get("tokenizer.chat_template"),
            special_ids=frozenset(i for i, t in enumerate(types) if t in (CONTROL, USER_DEFINED)),
        )
        made.max_token_bytes = max(len(made.token_bytes(i)) for i in range(len(tokens)))
        made._bytes.clear()
        return made

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        # encode_batch lets go of the GIL while it works (encode does not): a long prompt
        # tokenized on a worker thread then leaves the event loop running.
        ids = self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids
        wanted = self.add_bos if add_bos is None else add_bos
        if wanted and self.bos_id is not None and (not ids or ids[0] != self.bos_id):
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ModelFileError("the model has no chat template (tokenizer.chat_template)")
        try:
            template = self._template()
            return template.render(messages=messages,
                                   add_generation_prompt=add_generation_prompt,
                                   bos_token=self.token(self.bos_id),
                                   eos_token=self.token(self.eos_id))
        except TemplateError as error:
            raise ChatTemplateError(f"the model's chat template refused the messages: "
                                    f"{error}") from None

    def _template(self) -> Template:
        """The chat template, compiled on first use (a syntax error is a TemplateError on each
        request, as before) and then shared: a sandboxed template renders thread-safely."""
        compiled = self._compiled
        if compiled is None or compiled[0] != self.chat_template:
            with self._compile_lock:
                environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                compiled = (self.chat_template,
                            environment.from_string(self.chat_template))
                self._compiled = compiled
        return compiled[1]

    def token(self, index: int | None) -> str:
        return "" if index is None else (self.tokenizer.id_to_token(index) or "")

    def token_bytes(self, index: int) -> bytes:
        """The bytes a token stands for (its UTF-8 text for control tokens)."""
        known = self._bytes.get(index)
        if known is None:
            entry, chars = self.token(index), _byte_of_char()
            if index in self.special_ids:
                known = entry.encode()
            else:
                known = b"".join(bytes([chars[c]]) if c in chars else c.encode() for c in entry)
            self._bytes[index] = known
        return known

    def token_text(self, index: int) -> str:
        """A token's text for log-probabilities: its bytes as UTF-8, a partial character as
        U+FFFD (`token_bytes` keeps the exact bytes)."""
        return self.token_bytes(index).decode("utf-8", errors="replace")
