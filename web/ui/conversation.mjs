// The conversation view: one element per turn (the user's text; the assistant's tokens, each
// marked by its source), and the history sent with the next turn as [{role, content}, ...].

/** A conversation bound to its container element. */
export function createConversation(container) {
  const turns = [];   // {role, content} of the turns shown: the history the next turn carries

  function addTurn(role, text = "") {
    const turn = document.createElement("div");
    turn.className = `turn ${role}`;
    const who = document.createElement("span");
    who.className = "who";
    who.textContent = role === "user" ? "You" : "Model";
    const body = document.createElement("div");
    body.className = "turn-text";
    body.textContent = text;
    turn.append(who, body);
    container.append(turn);
    turn.scrollIntoView({ block: "nearest" });
    return body;
  }

  return {
    /** The messages of the finished turns (a copy). */
    get messages() { return turns.map((t) => ({ ...t })); },

    /** Show the user's turn and an empty answer; -> the answer's handle. */
    start(userText) {
      const userBody = addTurn("user", userText);
      const answerBody = addTurn("assistant");
      const record = { role: "user", content: userText };
      return {
        /** One tokens event: each token's text in a span marked by its source. */
        append(payload) {
          const texts = payload.token_texts ?? [payload.text];
          texts.forEach((text, i) => {
            if (!text) return;
            const source = payload.sources?.[i] ?? "baseline";
            const span = document.createElement("span");
            span.className = `tok src-${source}`;
            span.dataset.source = source;
            span.title = source;
            span.textContent = text;
            answerBody.append(span);
          });
        },
        /** A failure after output began: the answer ends with a visible mark. */
        markEnd(error) {
          const end = document.createElement("span");
          end.className = "answer-end";
          end.textContent = ` [answer ended: ${error.code}: ${error.message}]`;
          answerBody.append(end);
        },
        /** The answer is over (done, stopped or failed after output): both turns join the history. */
        keep(answerText) { turns.push(record, { role: "assistant", content: answerText }); },
        /** Refused before it started: both turns leave the view, the history is unchanged. */
        drop() { userBody.parentElement.remove(); answerBody.parentElement.remove(); },
      };
    },

    /** Forget every turn. */
    clear() {
      turns.length = 0;
      container.replaceChildren();
    },
  };
}
