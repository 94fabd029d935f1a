;;;; tour.lisp -- the compile-time Lisp that every SexpGPU run file is written in.
;;;;
;;;; Nothing here trains yet: it computes, at compile time, the kind of values an experiment
;;;; file derives from its knobs. `sexpgpu check examples/tour.lisp` reads and evaluates it;
;;;; `sexpgpu eval examples/tour.lisp '(describe-model *gpt-small*)'` asks it questions.

(defstruct model-shape (vocab 65) (width 128) (depth 4) (heads 4) (context 256))

(defun attention-params (width)
  "Query, key, value and output projections, with biases."
  (* 4 (+ (* width width) width)))

(defun mlp-params (width &key (expansion 4))
  (let ((hidden (* expansion width))) (+ (* width hidden) hidden (* hidden width) width)))

(defun block-params (width)
  (+ (attention-params width) (mlp-params width) (* 2 2 width)))

(defun model-params (shape)
  (+ (* (model-shape-vocab shape) (model-shape-width shape))
     (* (model-shape-context shape) (model-shape-width shape))
     (* (model-shape-depth shape) (block-params (model-shape-width shape)))))

(defun describe-model (shape)
  (format nil
          "~d layers of width ~d, ~d heads: ~:d parameters"
          (model-shape-depth shape)
          (model-shape-width shape)
          (model-shape-heads shape)
          (model-params shape)))

(defparameter *char-model* (make-model-shape))

(defparameter *gpt-small*
  (make-model-shape :vocab 50257 :width 768 :depth 12 :heads 12 :context 1024))

(defun log-grid (low high points)
  "POINTS learning rates spaced evenly in log space from LOW to HIGH."
  (let ((step (/ (log (/ high low)) (1- points))))
    (loop for i below points collect (* low (exp (* i step))))))

(defmacro with-warmup ((var steps) &body body)
  "Bind VAR to a function of the step that ramps linearly to 1 over STEPS."
  `(flet ((,var (step) (min 1.0 (/ (float step) ,steps)))) ,@body))

(defparameter *schedule* (with-warmup (ramp 100) (mapcar #'ramp '(0 50 100 200))))

(assert (= (model-params *char-model*) 834176))

(assert (equal *schedule* '(0.0 0.5 1.0 1.0)))

(assert (= (length (log-grid 1e-4 1e-1 4)) 4))
