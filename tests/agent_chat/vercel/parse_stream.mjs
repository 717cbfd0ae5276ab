// Parses a recorded `POST /v1/agent/chat?format=vercel-ai` response body with the `ai` package's
// own client-side code: `parseJsonEventStream` + `uiMessageChunkSchema` (what DefaultChatTransport
// uses to read the SSE) and `readUIMessageStream` (what useChat uses to build the UI message).
//
// stdin:  {"stream": "<raw SSE text>", "message": <UIMessage to continue, or null>}
// stdout: {"chunks": [...validated chunks], "message": <final UIMessage>, "errors": [...],
//          "invalid": [...chunks the schema rejected], "done": <saw data: [DONE]>}
import { parseJsonEventStream, readUIMessageStream, uiMessageChunkSchema } from "ai";

const input = JSON.parse(await new Promise((resolve) => {
  let text = "";
  process.stdin.setEncoding("utf8");
  process.stdin.on("data", (d) => (text += d));
  process.stdin.on("end", () => resolve(text));
}));

const bytes = new TextEncoder().encode(input.stream);
const body = new ReadableStream({
  start(controller) {
    // Split into small pieces to exercise the incremental parser like a real network read.
    for (let i = 0; i < bytes.length; i += 97) controller.enqueue(bytes.slice(i, i + 97));
    controller.close();
  },
});

const chunks = [];
const invalid = [];
const errors = [];
const chunkStream = parseJsonEventStream({ stream: body, schema: uiMessageChunkSchema }).pipeThrough(
  new TransformStream({
    transform(result, controller) {
      if (!result.success) {
        invalid.push({ error: String(result.error), raw: result.rawValue });
        return;
      }
      chunks.push(result.value);
      controller.enqueue(result.value);
    },
  }),
);

let message = null;
for await (const snapshot of readUIMessageStream({
  stream: chunkStream,
  message: input.message ?? undefined,
  onError: (error) => errors.push(String(error && error.message ? error.message : error)),
})) {
  message = snapshot;
}

process.stdout.write(JSON.stringify({
  chunks,
  message,
  errors,
  invalid,
  done: /(^|\n)data: \[DONE\]\n\n$/.test(input.stream),
}));
