/// <reference path="./wasmsched-policy-filter.d.ts" />
/// <reference path="./wasmsched-policy-mirror-usage.d.ts" />
/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/placement@0.2.0' {
  /**
   * `mirror-usage.update-usage(generation, usage)`, then `filter.filter(task, candidates)` —
   * except that with `enough`, the filter may stop at the candidate that makes `enough` fit:
   * `codes` then end there (exactly `enough` zeros, the last code a zero). The host wants the
   * first feasible nodes in its scan order, and this lets it send a generous window in one call
   * without paying for the nodes past the last one it needs. Answering every candidate is
   * always allowed.
   */
  export function filter(generation: bigint, usage: Array<[number, NodeUsage]>, task: StageTask, candidates: Uint32Array, enough: number | undefined): FilterResult;
  /**
   * `mirror-usage.update-usage(generation, usage)`, then `score.score(task, candidates)`.
   */
  export function score(generation: bigint, usage: Array<[number, NodeUsage]>, task: StageTask, candidates: Uint32Array): Uint32Array;
  export type Task = import('wasmsched:policy/types@0.2.0').Task;
  export type Qos = import('wasmsched:policy/types@0.2.0').Qos;
  export type NodeUsage = import('wasmsched:policy/mirror-usage@0.2.0').NodeUsage;
  export type FilterResult = import('wasmsched:policy/filter@0.2.0').FilterResult;
  /**
   * A `task` whose `request.extended`, `gpu.models`, `node-selector`, `node-affinity` (both
   * lists) and `tolerations` are empty; the other fields as in `task`, flattened.
   */
  export interface BriefTask {
    id: string,
    namespace: string,
    group?: string,
    queue: string,
    priority: number,
    qos: Qos,
    cpuMilli: bigint,
    memoryBytes: bigint,
    gpuMilli: bigint,
    gpuCount: number,
    milliPerGpu: number,
    memoryBytesPerGpu: bigint,
  }
  /**
   * The task of a stage call: `brief` whenever it can be, else `full`.
   */
  export type StageTask = StageTaskFull | StageTaskBrief;
  export interface StageTaskFull {
    tag: 'full',
    val: Task,
  }
  export interface StageTaskBrief {
    tag: 'brief',
    val: BriefTask,
  }
  /**
   * Why a call failed.
   */
  export type StageError = StageErrorOutOfStep | StageErrorFailed;
  /**
   * The usage changes could not be applied (a slot the mirror does not hold, another device
   * count): nothing was applied and the stage did not run. Not a fault: the host resends
   * the whole mirror and calls again, as after a refused `mirror-usage.update-usage`.
   */
  export interface StageErrorOutOfStep {
    tag: 'out-of-step',
    val: string,
  }
  /**
   * The stage failed: a plugin fault, as the error of `filter.filter` or `score.score`.
   */
  export interface StageErrorFailed {
    tag: 'failed',
    val: string,
  }
}
