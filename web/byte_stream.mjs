// byte_stream.mjs — a pass-through body that stays a byte stream: a reader downstream that reads
// into its own buffer (a BYOB reader: StreamedFile) has its reads passed upstream as reads of that
// size, so no layer between the network and the loader holds more than one read's bytes (the
// browser's own pieces are up to 2 MiB). Each piece is shown to onPiece on its way.
//
//   const body = passThrough(response.body, { onPiece(bytes) {...}, onEnd() {...}, onCancel(reason) {...} });
//   new Response(body, { headers })
export function passThrough(upstream, { onPiece = () => {}, onEnd = () => {}, onCancel = () => {} } = {}) {
  let byob = null, plain = null;
  try {
    byob = upstream.getReader({ mode: "byob" });
  } catch {
    plain = upstream.getReader();
  }
  return new ReadableStream({
    type: "bytes",
    async pull(controller) {
      const request = controller.byobRequest;
      let done, value;
      if (byob && request) {             // read upstream straight into the downstream reader's buffer
        ({ done, value } = await byob.read(request.view));
      } else if (byob) {
        ({ done, value } = await byob.read(new Uint8Array(128 * 1024)));
      } else {
        ({ done, value } = await plain.read());
      }
      if (done) {
        onEnd();
        controller.close();
        if (byob && request) request.respondWithNewView(value);   // the empty view of its (moved) buffer
        else if (request) request.respond(0);
        return;
      }
      onPiece(value);
      if (byob && request) request.respondWithNewView(value);
      else controller.enqueue(value);
    },
    cancel(reason) {
      onCancel(reason);
      return (byob ?? plain).cancel(reason);
    },
  });
}
