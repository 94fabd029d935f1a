;;;; sexpgpu/nn -- neural network layers, losses and metrics, written over the tensor builtins.
;;;;
;;;; (require "sexpgpu/nn" :as nn), then nn:linear, nn:mlp, nn:cross-entropy ...

(defmodel linear (d-in d-out &key (bias t))
  "y = x w + b, with w drawn from N(0, 1/d-in)."
  (defparam w (d-in d-out) :init (normal :std (/ 1.0 (sqrt d-in))))
  (defparam b (d-out) :init :zeros :when bias)
  (forward (x)
    (if b (+ (matmul x w) b) (matmul x w))))

(defun %layer-sizes (sizes)
  (loop for (a b) on sizes while b collect (list a b)))

(defmodel mlp (d-in d-hidden d-out &key (depth 1) (activation #'relu))
  "DEPTH hidden layers of width D-HIDDEN with ACTIVATION between them."
  (defpart layers (let ((sizes (append (list d-in)
                                       (make-list depth :initial-element d-hidden)
                                       (list d-out))))
                    (%stack-layers (%layer-sizes sizes))))
  (forward (x)
    (%apply-layers layers x activation)))

(defun %stack-layers (pairs)
  (%repeat-list (mapcar (lambda (pair) (lambda () (linear (first pair) (second pair)))) pairs)))

(defun %apply-layers (layers x activation)
  (let ((n (length (%models layers))))
    (loop for layer in (%models layers)
          for i from 1
          do (setq x (%call-model layer (list x))) (when (< i n) (setq x (funcall activation x))))
    x))

(defmodel embedding (vocab d &key (std 0.02))
  "Rows of a (vocab d) table picked by integer ids."
  (defparam table (vocab d) :init (normal :std std))
  (forward (ids)
    (take table ids)))

(defun cross-entropy (logits labels)
  "Mean negative log-likelihood of integer LABELS under softmax(LOGITS) over the last axis."
  (let* ((classes (car (last (shape logits))))
         (logp (log-softmax logits :axis -1))
         (picked (* logp (one-hot labels classes))))
    (neg (mean (sum picked :axis -1)))))

(defun accuracy (logits labels)
  "Fraction of rows whose largest logit is at the label."
  (mean (cast (= (argmax logits :axis -1) (cast labels :i32)) :f32)))

(defun mse (predictions targets)
  "Mean squared error."
  (mean (square (- predictions targets))))
