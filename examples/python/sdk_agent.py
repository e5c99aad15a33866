#!/usr/bin/env python3
"""The echo agent of agent.py, written on the Python SDK (sdk/python, `pip install ./sdk/python`)
instead of the raw protocol: it answers every call and works every task it is given.

    python sdk_agent.py --nats-url nats://127.0.0.1:4222 --agent py-sdk-echo
"""

import argparse
import asyncio

from switchboard import Agent


async def main(nats_url: str, agent_id: str) -> None:
    async with await Agent.connect(nats_url, agent_id,
                                   description="echo agent on the Python SDK") as agent:
        print(f"ready: {agent_id}, goal {agent.goal_id}", flush=True)
        async for message in agent.messages():
            if message.is_call:
                await message.reply(f"{agent_id} answers: {message.body}")
            elif message.kind == "task":
                task = await message.task().accept()
                await task.start()
                await task.complete(f"{agent_id} did: {message.body}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats-url", default="nats://127.0.0.1:4222")
    parser.add_argument("--agent", default="py-sdk-echo")
    args = parser.parse_args()
    try:
        asyncio.run(main(args.nats_url, args.agent))
    except KeyboardInterrupt:
        pass
