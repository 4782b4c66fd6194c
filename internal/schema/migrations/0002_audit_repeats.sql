-- Refusals of callers that lack the privilege are folded: within a window
-- an actor's further refused attempts at one action raise the repeats of
-- its first refused row instead of adding rows, so that a token cannot
-- flood the audit log and push real changes off its first pages.
ALTER TABLE audit ADD COLUMN repeats integer NOT NULL DEFAULT 0;
-- The fold looks up the actor's latest refused row of the action.
CREATE INDEX audit_refused_actor ON audit (actor, action, at DESC) WHERE outcome = 'refused';
