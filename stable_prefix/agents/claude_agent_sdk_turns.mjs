// Turns of one conversation through the Claude Agent SDK (`query`), written by stable-prefix
// (stable_prefix/agents/claude_agent_sdk.py runs it): the first prompt starts a session, each later one resumes it.
//
//   node claude_agent_sdk_turns.mjs SDK_ENTRY CLAUDE_BINARY WORKDIR PROMPT [PROMPT ...]
//
// SDK_ENTRY: the installed SDK's sdk.mjs; CLAUDE_BINARY: the Claude Code it drives
// (pathToClaudeCodeExecutable). The Claude Code it starts gets this process's environment.
// One JSON line per turn on stdout: {"turn", "session_id", "subtype", "num_turns"}.
import { pathToFileURL } from "node:url";

const [sdkEntry, claudeBinary, workdir, ...prompts] = process.argv.slice(2);
const { query } = await import(pathToFileURL(sdkEntry).href);

let sessionId;
for (const [index, prompt] of prompts.entries()) {
  const options = {
    pathToClaudeCodeExecutable: claudeBinary,
    cwd: workdir,
    env: { ...process.env },
    maxTurns: 1,
    settingSources: [],
    ...(sessionId ? { resume: sessionId } : {}),
  };
  let result;
  for await (const message of query({ prompt, options })) {
    if (message.type === "result") result = message;
  }
  if (!result) throw new Error(`turn ${index + 1}: the SDK gave no result message`);
  sessionId = result.session_id;
  console.log(JSON.stringify({ turn: index + 1, session_id: result.session_id, subtype: result.subtype, num_turns: result.num_turns }));
}
