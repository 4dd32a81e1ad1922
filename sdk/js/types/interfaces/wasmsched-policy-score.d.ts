/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/score@0.2.0' {
  /**
   * One score per candidate, each in 0..=100 after the plugin's own normalisation.
   */
  export function score(task: Task, candidates: Uint32Array): Uint32Array;
  export type Task = import('wasmsched:policy/types@0.2.0').Task;
}
