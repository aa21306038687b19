"""``pagedkv chat``: an interactive chat that streams the reply token by token."""

from __future__ import annotations

import argparse
import sys

from pagedkv.entrypoints.engine_args import (
    add_engine_arguments,
    add_sampling_arguments,
    build_llm,
    sampling_params,
)

NAME = "chat"
HELP = "Chat interactively with a model; replies stream as they are generated (/exit to quit)."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--system", default=None, help="system prompt for the conversation (default: none)"
    )
    add_sampling_arguments(parser, max_tokens=512)
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    llm = build_llm(args)
    engine, tok = llm.llm_engine, llm.get_tokenizer()
    history = [{"role": "system", "content": args.system}] if args.system else []
    print(
        "pagedkv chat: type a message; /reset clears the conversation, /exit quits.",
        file=sys.stderr,
    )
    turn = 0
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if line.strip() in ("/exit", "/quit"):
            return 0
        if line.strip() == "/reset":
            history = history[:1] if args.system else []
            continue
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        prompt = tok.apply_chat_template(history, add_generation_prompt=True)
        ids = tok.encode(prompt, add_special_tokens=False)
        rid = f"chat-{turn}"
        turn += 1
        try:
            engine.add_request(rid, prompt, params, prompt_token_ids=ids)
        except ValueError as e:  # the conversation outgrew --max-model-len: say so, go on
            print(f"error: {e} (/reset starts a new conversation)", file=sys.stderr)
            history.pop()
            continue
        reply = _stream(engine, rid)
        history.append({"role": "assistant", "content": reply})


def _stream(engine, rid: str) -> str:
    shown = ""
    try:
        while engine.has_unfinished_requests():
            for out in engine.step():
                text = out.outputs[0].text
                sys.stdout.write(text[len(shown) :])
                sys.stdout.flush()
                shown = text
    except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
        engine.abort_request(rid)
    sys.stdout.write("\n")
    return shown
