;;;; aux.lisp -- our own versions of the helpers the ANSI tests call (signals-error,
;;;; notnot, eqlt, +code-chars+ ...), written from what the tests expect of them; loaded
;;;; before every file by bench/ansi_agreement.py, in SBCL and in SexpGPU alike.
;;@@CASE
(defun notnot (x) (not (not x)))
;;@@CASE
(defmacro notnot-mv (form) `(multiple-value-call (lambda (&optional x &rest more) (apply #'values (notnot x) more)) ,form))
;;@@CASE
(defmacro not-mv (form) `(multiple-value-call (lambda (&optional x &rest more) (apply #'values (not x) more)) ,form))
;;@@CASE
(defun eqt (a b) (notnot (eq a b)))
;;@@CASE
(defun eqlt (a b) (notnot (eql a b)))
;;@@CASE
(defun equalt (a b) (notnot (equal a b)))
;;@@CASE
(defun equalpt (a b) (notnot (equalp a b)))
;;@@CASE
(defmacro signals-error (form condition &rest keys)
  (declare (ignore keys))
  `(handler-case (progn (locally (declare (optimize (safety 3))) ,form) nil) (,condition () t)))
;;@@CASE
(defmacro signals-type-error (var datum form &rest keys)
  (declare (ignore keys))
  `(let ((,var ,datum))
     (handler-case (progn (locally (declare (optimize (safety 3))) ,form) nil)
       (type-error (c) (let ((d (type-error-datum c))) (and (eql d ,var) (not (typep d (type-error-expected-type c)))))))))
;;@@CASE
(defmacro classify-error (form)
  `(handler-case ,form (type-error () 'type-error) (program-error () 'program-error) (control-error () 'control-error) (error () 'error)))
;;@@CASE
(defmacro expand-in-current-env (form &environment env) (macroexpand form env))
;;@@CASE
(defun scaffold-cells (x acc) (if (consp x) (scaffold-cells (cdr x) (scaffold-cells (car x) (cons (list x (car x) (cdr x)) acc))) acc))
;;@@CASE
(defun make-scaffold-copy (x) (scaffold-cells x nil))
;;@@CASE
(defun check-scaffold-copy (x copy) (declare (ignore x)) (every (lambda (e) (and (eq (car (first e)) (second e)) (eq (cdr (first e)) (third e)))) copy))
;;@@CASE
(defun random-from-interval (upper &optional (lower 0)) (+ lower (random (- upper lower))))
;;@@CASE
(defun random-fixnum () (- (random (* 2 most-positive-fixnum)) most-positive-fixnum))
;;@@CASE
(defun is-ordered-by (seq fn)
  (let ((n (length seq)))
    (loop for i below n always (loop for j from (1+ i) below n always (funcall fn (elt seq i) (elt seq j))))))
;;@@CASE
(defun is-antisymmetrically-ordered-by (seq fn)
  (let ((n (length seq)))
    (loop for i below n always (loop for j from (1+ i) below n always (and (funcall fn (elt seq i) (elt seq j)) (not (funcall fn (elt seq j) (elt seq i))))))))
;;@@CASE
(defparameter +code-chars+ (coerce (loop for i below 256 collect (code-char i)) 'simple-string))
;;@@CASE
(defparameter +rev-code-chars+ (reverse +code-chars+))
;;@@CASE
(defparameter +standard-chars+ (concatenate 'string "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" "!$\"'(),_-./:;?+<=>#%&*@[\\]{|}`^~ " (string #\Newline)))
;;@@CASE
(defparameter +digit-chars+ "0123456789")
;;@@CASE
(defparameter +upper-case-chars+ "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
;;@@CASE
(defparameter +lower-case-chars+ "abcdefghijklmnopqrstuvwxyz")
;;@@CASE
(defparameter +alpha-chars+ (concatenate 'string +upper-case-chars+ +lower-case-chars+))
;;@@CASE
(defparameter +alphanumeric-chars+ (concatenate 'string +alpha-chars+ +digit-chars+))
;;@@CASE
(defparameter *numbers* (list 0 1 -1 2 -2 17 -23 1000000000000 -1000000000000 1/2 -1/2 3/7 -11/5 0.0d0 -0.0d0 1.5d0 -2.25d0 1d10 1d-10))
;;@@CASE
(defparameter *reals* *numbers*)
;;@@CASE
(defparameter *universe* (list nil t 0 1 -7 123456789012345678901234567890 1/3 2.5d0 -0.0d0 #\a #\Space "" "abc" 'sym :key (list 1 2) (cons 1 2) (vector 1 2) (make-array 0) (make-hash-table) #'car '(a . b) "A" #\Z 'nil))
;;@@CASE
(defun check-type-error (fn pred)
  (loop for x in *universe* unless (funcall pred x) always (handler-case (progn (funcall fn x) nil) (type-error () t))))
;;@@CASE
(defun char-type-error-check (fn) (check-type-error fn #'characterp))
;;@@CASE
(defun subtypep* (a b) (subtypep a b))
;;@@CASE
(defun make-array-with-checks (dims &rest options) (apply #'make-array dims options))
