"""Chat conversations to tokens and a loss mask, with the tokenizer's own chat template.

The template is the Jinja text of `chat_template` in the tokenizer's tokenizer_config.json,
rendered the way transformers' apply_chat_template renders it (a sandboxed Jinja environment
with trim_blocks and lstrip_blocks, raise_exception, the special tokens by name, messages and
add_generation_prompt), and the text is tokenized without adding special tokens (the template
writes them).

The loss mask keeps the assistant's replies: for each assistant message, the text the template
adds after the prompt for that reply (the conversation so far rendered with
add_generation_prompt) up to the conversation including the reply, so the reply's own end of
turn is learned and the role header is not. A token is kept when it starts inside such a span.
With every token kept (loss_on == "all") no mask is needed.
"""
import json


class ChatError(Exception):
    """A conversation this template cannot turn into tokens and a mask; the record is bad."""


def token_text(value):
    """A special token in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def load_template(config_path):
    """(template text, special tokens by name) from a tokenizer_config.json."""
    with open(config_path, encoding="utf-8") as f:
        cfg = json.load(f)
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: the default one, as transformers picks
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str) or not template:
        raise ValueError(f"{config_path}: no chat_template (a Jinja string) to render conversations with")
    specials = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        text = token_text(cfg.get(name))
        if isinstance(text, str):
            specials[name] = text
    extra = cfg.get("additional_special_tokens")
    if isinstance(extra, list):
        specials["additional_special_tokens"] = [token_text(t) for t in extra]
    return template, specials


class ChatRenderer:
    def __init__(self, template, specials):
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        self.template, self.specials, self.jinja = env.from_string(template), specials, jinja2

    def render(self, messages, add_generation_prompt=False):
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        **self.specials)
        except self.jinja.exceptions.TemplateError as e:
            raise ChatError(f"the chat template refuses it: {e}") from None

    def spans(self, messages):
        """The full text and the character spans of the assistant replies in it."""
        full = self.render(messages)
        spans = []
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            prompt = self.render(messages[:i], add_generation_prompt=True)
            upto = self.render(messages[:i + 1])
            if not upto.startswith(prompt) or not full.startswith(upto):
                raise ChatError(f"the chat template does not render message {i + 1}'s conversation as a prefix of "
                                "the whole one, so its reply cannot be located (use --loss-on all)")
            spans.append((len(prompt), len(upto)))
        return full, spans


def check_messages(value, field):
    """The messages of a record, or the reason they are bad."""
    if not isinstance(value, list) or not value:
        return None, f"field '{field}' is not a non-empty list of messages"
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            return None, f"message {i + 1} of field '{field}' is not an object with string role and content"
    if not any(m["role"] == "assistant" and m["content"].strip() for m in value):
        return None, f"field '{field}' has no assistant message with content (nothing to learn)"
    return [{"role": m["role"], "content": m["content"]} for m in value], None


def encode_chat(renderer, tokenizer, messages, loss_on):
    """(token ids, mask bytes or None) of one conversation."""
    full, spans = renderer.spans(messages)
    enc = tokenizer.encode(full, add_special_tokens=False)
    if loss_on == "all":
        return enc.ids, None
    mask = bytearray(len(enc.ids))
    k = 0
    for t, (start, _) in enumerate(enc.offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= start < spans[k][1]:
            mask[t] = 1
    if not any(mask):
        raise ChatError("no token of an assistant reply survived tokenization")
    return enc.ids, bytes(mask)
