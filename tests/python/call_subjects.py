"""Where a call's broker messages go: a nats-py caller calls a nats-py callee 50 times (after
20 warm-up calls) while a subscription on `>` counts every message the server routes, by
subject with ids masked. Prints messages per call and the subjects, most first.

    switchboard up &    # or any fabric on loopback
    .tools/py-venv/bin/python tests/python/call_subjects.py nats://127.0.0.1:4222

docs/performance.md ("Where a call's 24.5 broker messages go") shows one run.
"""
import asyncio, json, sys, uuid, collections, re
import nats
URL=sys.argv[1]
async def request(nc, subject, body, timeout=10):
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=timeout)
    return json.loads(msg.data)
def norm(s):
    s=re.sub(r'[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}','<id>',s)
    s=re.sub(r'_INBOX\.[^ ]*','_INBOX.*',s)
    s=re.sub(r'bench-[a-z]+-[0-9a-f]{8}','<agent>',s)
    s=re.sub(r'\$JS\.ACK\.[^ ]*','$JS.ACK.*',s)
    return s
async def main():
    run=uuid.uuid4().hex[:8]
    ce, cr = f"bench-callee-{run}", f"bench-caller-{run}"
    callee = await nats.connect(URL, inbox_prefix=f"_INBOX.{ce}".encode())
    caller = await nats.connect(URL, inbox_prefix=f"_INBOX.{cr}".encode())
    for nc, me in ((callee, ce), (caller, cr)):
        await request(nc, f"agent.registry.register.{me}", {"description": "tap"})
    goal=(await request(callee, f"agent.registry.goal.open.{ce}", {}))["goal_id"]
    cgoal=(await request(caller, f"agent.registry.goal.open.{cr}", {}))["goal_id"]
    stop=asyncio.Event()
    async def serve():
        ack=None
        while not stop.is_set():
            body={"goal_id":goal,"max":64,"wait_ms":1000}
            if ack is not None: body["ack_through"]=ack
            page=await request(callee, f"agent.inbox.fetch.{ce}", body, timeout=5)
            for item in page["messages"]:
                ack=item["seq"]; m=item["message"]
                if m.get("kind")=="request":
                    await request(callee, f"agent.reply.{ce}", {"correlation_id":m["correlation_id"],"message":m["body"]})
    srv=asyncio.create_task(serve())
    for _ in range(20):
        await request(caller, f"agent.call.{cr}", {"to":ce,"message":"x"*256,"timeout_ms":30000,"from_goal_id":cgoal}, timeout=40)
    tap=await nats.connect(URL)
    counts=collections.Counter()
    async def seen(msg): counts[norm(msg.subject)]+=1
    sub=await tap.subscribe(">", cb=seen)
    await tap.flush(); await asyncio.sleep(0.5); counts.clear()
    N=50
    for _ in range(N):
        await request(caller, f"agent.call.{cr}", {"to":ce,"message":"x"*256,"timeout_ms":30000,"from_goal_id":cgoal}, timeout=40)
    await asyncio.sleep(2)
    total=sum(counts.values())
    print(f"{total/N:.1f} messages per call")
    for k,v in counts.most_common(40):
        print(f"{v/N:6.2f}  {k}")
    stop.set()
asyncio.run(main())
