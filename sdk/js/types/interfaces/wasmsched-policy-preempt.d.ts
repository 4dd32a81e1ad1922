/// <reference path="./wasmsched-policy-types.d.ts" />
declare module 'wasmsched:policy/preempt@0.2.0' {
  /**
   * None: preemption cannot make room. The host re-checks that the choice really fits.
   */
  export function selectVictims(preemptor: Task, candidates: Array<Candidate>): Preemption | undefined;
  export type Task = import('wasmsched:policy/types@0.2.0').Task;
  export interface Victim {
    task: Task,
    /**
     * Seconds since the victim started running.
     */
    runningSeconds: bigint,
    /**
     * Members of the victim's group currently running, and its min-member.
     */
    groupRunning: number,
    groupMinMember: number,
    /**
     * The victim can save a checkpoint when asked (it will be given its grace period).
     */
    checkpointable: boolean,
  }
  export interface Candidate {
    /**
     * Mirror slot of the node.
     */
    node: number,
    /**
     * Tasks on the node that the host allows to be preempted, lowest priority first.
     */
    victims: Array<Victim>,
  }
  export interface Preemption {
    /**
     * Index into the candidate list.
     */
    candidate: number,
    /**
     * Indexes into that candidate's victims.
     */
    victims: Uint32Array,
  }
}
