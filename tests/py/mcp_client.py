"""lemonade's MCP gateway with the official `mcp` Python client (run by
crates/cli/tests/router.rs): the Streamable HTTP transport, the initialize handshake, the tool
list, a chat on a real llama-server, a transcription on a real whisper-server, and a tool error
as an isError result. A failure exits non-zero naming what was wrong."""

import asyncio
import json
import re
import sys

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

base, llm, whisper, wav, sentence = sys.argv[1:6]


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")


def texts(result):
    return [c.text for c in result.content if getattr(c, "type", "") == "text"]


async def main():
    async with streamable_http_client(f"{base}/mcp") as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            check(init.server_info.name == "lemonade", f"server name {init.server_info}")
            check(init.capabilities.tools is not None, f"tools capability {init.capabilities}")
            await session.send_ping()

            tools = await session.list_tools()
            names = sorted(t.name for t in tools.tools)
            check(
                names == ["lemonade_chat", "lemonade_generate_image", "lemonade_list_models", "lemonade_omni", "lemonade_transcribe_audio"],
                f"tools {names}",
            )

            listed = await session.call_tool("lemonade_list_models", {})
            data = json.loads(texts(listed)[1])
            check(llm in data["available"], f"{llm} in {data}")

            chat = await session.call_tool(
                "lemonade_chat",
                {"model": llm, "messages": [{"role": "user", "content": "Which city is the capital of France?"}],
                 "max_tokens": 12, "temperature": 0},
            )
            check(not chat.is_error, f"chat failed: {texts(chat)}")
            check("Paris" in texts(chat)[0], f"chat answer {texts(chat)}")

            heard = await session.call_tool("lemonade_transcribe_audio", {"model": whisper, "audio_path": wav})
            check(not heard.is_error, f"transcription failed: {texts(heard)}")
            want = re.findall(r"[a-z']+", sentence.lower())
            got = set(re.findall(r"[a-z']+", texts(heard)[0].lower()))
            check(sum(w in got for w in want) * 4 >= len(want) * 3, f"heard {texts(heard)[0]!r} for {sentence!r}")
            check(json.loads(texts(heard)[1])["text"].strip() == texts(heard)[0], f"full answer {texts(heard)}")

            missing = await session.call_tool("lemonade_chat", {"model": "user.No-Such-Model", "messages": [{"role": "user", "content": "hi"}]})
            check(missing.is_error and "No-Such-Model" in texts(missing)[0], f"unknown model: {missing}")
            bad = await session.call_tool("lemonade_transcribe_audio", {"model": whisper})
            check(bad.is_error and "audio_path" in texts(bad)[0], f"no audio: {bad}")
    print("every check held")


asyncio.run(main())
