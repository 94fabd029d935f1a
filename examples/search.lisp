;;;; search.lisp -- a sweep that searches: 16 points drawn from distributions, and
;;;; successive halving that stops the weak ones early (`sexpgpu sweep examples/search.lisp
;;;; --sweep search`, on this machine or with --ray). See docs/knobs-variants-and-sweeps.md.

(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)

(defknob lr 0.1 :doc "SGD learning rate")
(defknob width 64 :doc "hidden width of the MLP")

;; Point N is drawn from the seed alone: it is the same point whatever :sample says. At
;; step 50, the best third of the 16 points (by val/loss) go on to step 150; the best third
;; of those train to the end. The others are `pruned`, their checkpoints kept.
(defsweep search
  :sample 16
  :seed 0
  :lr (log-uniform 0.003 0.3)
  :width (choice 16 32 64 128)
  :halving (:metric val/loss :mode :min :rungs (50 150) :keep 1/3))

(defloader train
  :source (synthetic :spirals :n 2048 :classes 3 :seed 0)
  :prepare ((split :train 0.8 :seed 0))
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 64)

(defloader val
  :source (synthetic :spirals :n 2048 :classes 3 :seed 0)
  :prepare ((split :train 0.8 :seed 0))
  :part val
  :fields ((x :f32 (2)) (y :i32 ()))
  :batch 256)

(defpart net (nn:mlp 2 width 3))

(defobjective (batch)
  (nn:cross-entropy (net (field batch x)) (field batch y)))

(defevaluate (batch)
  (let ((logits (net (field batch x))))
    (metric loss (nn:cross-entropy logits (field batch y)))
    (metric acc (nn:accuracy logits (field batch y)))))

(defeval val :loader val :every 50)

(defgroups (all "**" (optim:sgd :lr lr)))

(defrun :steps 450 :seed 0 :checkpoint (:every 150 :keep 2))
