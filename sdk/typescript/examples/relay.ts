// A TypeScript agent that answers each call by giving the work to another agent as a task
// and answering with the task's result: the middle of tests/sdk_cross.rs's conversation
// (a Python agent calls it; it gives a task to a Rust agent). SWITCHBOARD_NKEY_SEED, when
// set, signs it in under the generated NATS accounts. SIGTERM stops it gracefully.
//
//   node dist/examples/relay.js <nats url> <agent id> <worker agent id>
import { Agent } from '../src/index.js';

const [url, id, worker] = process.argv.slice(2);
const agent = await Agent.connect(url, id, {
  description: 'relays calls to a worker as tasks',
  nkeySeed: process.env.SWITCHBOARD_NKEY_SEED,
});
console.log(`ready ${agent.goalId}`);
await agent.serve(async (message) => {
  if (!message.isCall) return;
  let task = await agent.createTask(worker, message.body, { deadlineInMs: 30_000 });
  for (let i = 0; i < 300 && task.state !== 'completed' && task.state !== 'failed'; i++) {
    await new Promise((r) => setTimeout(r, 50));
    task = await task.refresh();
  }
  await message.reply(`via ${id}: ${task.result ?? task.state}`);
}, { maxConcurrent: 8 });
