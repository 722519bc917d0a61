// draft_inline.mjs — the WASM draft run in the caller's own thread (the orchestrator worker), with
// DraftWorkerClient's interface: no messages, so a CPU speculative round is one bridge call.
//   const draft = await InlineDraft.create({ wasmUrl, modelUrl });
//   const draft = new InlineDraft(champion.draft);   // the draft half of a WASM champion's instance
//                                                    // (createWasmChampion({draft}): one CPU module)
//   await draft.forward(ids, startPos);  await draft.propose({...});  draft.kill(); draft.terminate();
// Calls run to completion synchronously (wrapped in promises for the shared interface), so there is
// never a call in flight to cancel or to go stale: its stale counts are always zero.
import { createDraft } from "./draft.mjs";
import { codedError } from "../protocol.mjs";

export class InlineDraft {
  static async create({ wasmUrl, modelUrl, configJson = null }) {
    return new InlineDraft(await createDraft({ wasmUrl, modelUrl, configJson }));
  }

  constructor(draft) {
    this.draft = draft;
    this.placement = "inline";
    this.worker = null;                // no worker: nothing to post a stale envelope into
    this.vocabSize = draft.vocabSize;
    this.maxContext = draft.maxContext;
    this.identity = draft.identity;
    this.artifactBytes = draft.artifactBytes;
    this.epoch = 0;
    this.dead = null;                  // {code, message} once unusable
  }

  _live() {
    if (this.dead) throw codedError(this.dead.code, this.dead.message);
    return this.draft;
  }

  _die(code, message) {
    if (this.dead) return;
    this.dead = { code, message };
    this.lastMemoryBytes = this.draft.memoryBytes;
    this.draft = null;                 // the instance and its memory go with the last reference
  }

  get memoryBytes() { return this.draft ? this.draft.memoryBytes : (this.lastMemoryBytes ?? 0); }

  /** The request's epoch (kept for the interface; an inline call cannot be overtaken by one). */
  setEpoch(epoch) { this.epoch = Math.max(this.epoch, epoch); }

  async forward(ids, startPos) { this._live().forward(ids, startPos); }

  /** -> {tokens: Int32Array m, pDraft: Float32Array m*V, error_code} (Draft.propose, its optional
   *  firstStep and maskBits included) */
  async propose(args) { return this._live().propose(args); }

  /** propose(), synchronously. */
  proposeNow(args) { return this._live().propose(args); }

  /** Fault injection (tests): the next proposal's logits are NaN. */
  async injectNaN() { this._live().injectNaNOnce(); }

  /** Fault injection (tests): the draft is lost as a crashed worker would be. */
  kill() { this._die("E_DRAFT_LOST", "inline draft was killed"); }

  get staleCounts() { return { draft_client: 0, draft_worker: 0 }; }

  terminate() { this._die("E_TERMINATED", "inline draft released"); }
}
