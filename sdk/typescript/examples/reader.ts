// A TypeScript agent that reads a goal and prints each message's body, one per line, and
// starts reading again when the fabric is briefly unavailable (an inbox replica went away):
// tests/exactly_once.rs checks that every message of a burst is printed exactly once while
// inbox replicas are killed under it. The goal refuses messages while full, so a sender that
// keeps it full learns at once (`inbox_full`) and nothing is removed unread.
//
//   node dist/examples/reader.js <nats url> <agent id> <goal name>
import { Agent, Unavailable } from '../src/index.js';

const [url, id, name] = process.argv.slice(2);
const agent = await Agent.connect(url, id, { description: 'prints what it reads', openGoal: false });
const goal = await agent.openGoal({ name, overflow: 'refuse' });
console.log(`ready ${goal}`);
for (;;) {
  try {
    for await (const message of agent.messages({ goalId: goal, waitMs: 500 })) {
      console.log(message.body);
    }
    break; // the agent closed
  } catch (err) {
    if (!(err instanceof Unavailable)) throw err;
    console.log('restart');
  }
}
